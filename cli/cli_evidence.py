"""``g2rpo eval``, ``g2rpo compare`` and ``g2rpo report``: the evidence commands."""

from __future__ import annotations

import argparse
import json


def _cmd_eval_world(args: argparse.Namespace) -> int:
    from g2rpo.common.paths import DEFAULT_WORLD
    from g2rpo.world.evaluate import evaluate_world

    world = args.world or DEFAULT_WORLD
    report = evaluate_world(
        world,
        samples_per_prompt=args.samples_per_prompt or 5,
        seed=0 if args.seed is None else args.seed,
        grid_path=args.grid,
    )
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"world: {world}")
    for split in ("held_out", "train"):
        r = report[split]
        c = r["checker"]
        print(
            f"  {split:8s} {r['samples']} samples of {r['prompts']} prompts: checker pass "
            f"{c['pass']:.1%} (bg {c['bg']:.1%}, fg {c['fg']:.1%}, shape {c['shape']:.1%}), "
            f"shapes_clip {r['shapes_clip_mean']:.3f}"
        )
    print(
        f"  shapes_clip AUC correct vs mismatched (held-out ground truth): "
        f"{report['shapes_clip_auc']:.3f} ({report['shapes_clip_gt_mean']:.3f} vs "
        f"{report['shapes_clip_mismatched_mean']:.3f})"
    )
    if args.grid:
        print(f"  sample grid: {args.grid}")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    if args.target == "world":  # a run directory named world: pass ./world
        return _cmd_eval_world(args)
    from g2rpo.evaluation.eval_command import eval_command

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.json:
        _quiet_weight_loading()
    summary, paths = eval_command(
        args.target,
        base=args.base,
        no_base=args.no_base,
        checkpoint=args.checkpoint,
        out=args.out,
        progress=not args.json,
        splits=args.splits,
        prompts_per_split=args.prompts,
        samples_per_prompt=args.samples_per_prompt,
        seed=args.seed,
        num_steps=args.steps,
        scorers=args.scorers.split(",") if args.scorers else None,
        device=args.device,
    )
    if args.json:
        print(json.dumps(summary))
        return 0
    print(paths["markdown"].read_text(), end="")
    print(f"wrote {paths['json']}, {paths['markdown']} and {paths['grid']}")
    return 0


def _quiet_weight_loading() -> None:
    """No per-model "Loading weights" bars from transformers/diffusers in logs."""
    import diffusers.utils.logging
    import transformers.utils.logging

    transformers.utils.logging.disable_progress_bar()
    diffusers.utils.logging.disable_progress_bar()


def _cmd_compare(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from g2rpo.evaluation.compare import compare
    from g2rpo.evaluation.compare_spec import load_spec

    spec = load_spec(args.spec, args.set)
    if args.no_progress:
        _quiet_weight_loading()
    trainer = None
    if args.in_process:
        from g2rpo.orchestration.warm_trainer import WarmTrainer

        trainer = WarmTrainer()
    from g2rpo.common.cluster.stopping import interrupted_exit_code, sigterm_as_interrupt

    try:
        with sigterm_as_interrupt():
            root = compare(
                spec, progress=not args.no_progress, train=not args.eval_only, train_one=trainer
            )
    except KeyboardInterrupt as exc:
        print(f"interrupted; run the same command again to resume {spec.root}")
        return interrupted_exit_code(exc)
    finally:
        if trainer is not None:
            trainer.close()
    print((root / "table.md").read_text(), end="")
    print(f"wrote {root}/results.json, table.md, reward_vs_nfe.png, reward_vs_wall.png, grid.png")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from g2rpo.evaluation.report import write_report

    path = write_report(args.dir, args.out)
    print(f"wrote {path}")
    if args.screenshot:
        from g2rpo.evaluation.browser import check_page

        check = check_page(path, [], args.screenshot)
        for err in check.console_errors:
            print(f"  browser console error: {err}")
        print(f"wrote {args.screenshot} (headless Chromium, {check.broken_images} broken images)")
    return 0


def add_evidence_parsers(sub) -> None:
    ev = sub.add_parser(
        "eval",
        help="evaluate a run, a pipeline or a LoRA export on fixed noise against its base",
        description="TARGET: a run directory (final/ or --checkpoint), a diffusers pipeline "
        "directory, or a LoRA export (with --base). `g2rpo eval world` checks the committed "
        "shapes world itself (checker pass rate, shapes_clip AUC); a run directory named "
        "world is ./world.",
    )
    ev.add_argument("target", help="run dir | pipeline dir | LoRA export | world")
    ev.add_argument("--base", default=None, help="base pipeline (default: the run's own)")
    ev.add_argument("--no-base", action="store_true", help="skip the paired base comparison")
    ev.add_argument(
        "--checkpoint", default=None, help="final (default), latest, or an iteration number"
    )
    ev.add_argument("--out", default=None, help="output dir (default: RUN/eval/<which>)")
    ev.add_argument(
        "--splits",
        type=lambda s: [x for x in s.split(",") if x],
        default=None,
        help="held_out,train (default both) or prompt files",
    )
    ev.add_argument("--prompts", type=int, default=None, help="prompts per split (default 40)")
    ev.add_argument("--samples-per-prompt", type=int, default=None, help="default 8")
    ev.add_argument("--seed", type=int, default=None, help="noise seed (default 10000)")
    ev.add_argument("--steps", type=int, default=None, help="ODE steps (default: the run's)")
    ev.add_argument("--scorers", default=None, help="NAME[=DIR],... (default: the run's)")
    ev.add_argument("--device", default=None, help="cpu | cuda")
    ev.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ev.add_argument("--json", action="store_true")
    ev.add_argument("--world", default=None, help="`eval world`: world dir (default: committed)")
    ev.add_argument("--grid", default=None, help="`eval world`: write a sample grid PNG here")
    ev.set_defaults(func=_cmd_eval)

    cmp = sub.add_parser(
        "compare",
        help="train methods x seeds at an equal NFE (or iteration) budget and compare them",
        description="SPEC: a YAML comparison (see configs/compare/). Runs go through "
        "`g2rpo train`; running the same command again resumes, skipping finished runs.",
    )
    cmp.add_argument("spec", help="comparison spec YAML")
    cmp.add_argument("--set", action="append", default=[], metavar="a.b=c")
    cmp.add_argument("--eval-only", action="store_true", help="evaluate the finished runs only")
    cmp.add_argument(
        "--in-process",
        action="store_true",
        help="train the runs one after another in this process, on Ray actors kept "
        "between runs (no process and model loading per run: faster on one machine)",
    )
    cmp.add_argument("--no-progress", action="store_true")
    cmp.set_defaults(func=_cmd_compare)

    rep = sub.add_parser("report", help="one self-contained HTML page for a run or a comparison")
    rep.add_argument("dir", help="a run directory or a comparison directory")
    rep.add_argument("--out", default=None, help="HTML path (default: DIR/report.html)")
    rep.add_argument(
        "--screenshot", default=None, help="also render it in headless Chromium to this PNG"
    )
    rep.set_defaults(func=_cmd_report)
