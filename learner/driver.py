"""``g2rpo train``: the thin driver loop. Rollout workers and the learner are Ray
actors; rewards come from reward-server replicas (started locally when none are
configured). Everything an iteration draws is a pure function of (seed,
iteration, worker), so a redone rollout or a resumed run reproduces itself."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import ray
import torch
from tqdm.auto import tqdm

from ..common.config import G2RPOConfig, dump_config, load_config
from ..common.shapes import split_combinations
from .cluster import RunActors, record_actors, start_actors

CKPT = "checkpoints"


def _prompts(spec: str) -> list[str]:
    if spec in ("shapes:train", "shapes:held_out"):
        train, held = split_combinations()
        return [s.prompt for s in (train if spec == "shapes:train" else held)]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"train.prompts: {spec!r} is neither shapes:train/held_out nor a file")
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"train.prompts: {spec} holds no prompts")
    return lines


def prompts_for(all_prompts: list[str], seed: int, iteration: int, count: int) -> list[str]:
    """The iteration's prompts: a seeded draw without replacement (stateless sampler)."""
    rng = np.random.default_rng([seed, iteration, 7])
    replace = count > len(all_prompts)
    return [all_prompts[i] for i in rng.choice(len(all_prompts), count, replace=replace)]


def _latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = sorted((run_dir / CKPT).glob("it_*.pt"))
    return ckpts[-1] if ckpts else None


def _get_with_retry(make_call, workers, index: int, attempts: int = 3):
    """Run a worker call; if the actor died, wait for Ray to restart it and redo it."""
    for attempt in range(attempts):
        try:
            return ray.get(make_call(workers[index]))
        except ray.exceptions.RayActorError:
            if attempt == attempts - 1:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


def _load_call(version, ref, checksum):
    def call(worker):
        return worker.load_weights.remote(version, ref, checksum)

    return call


def _redo(version, ref, checksum, iteration, prompts, reward_args):
    """A rollout call for a (possibly restarted) actor: reload the weights, then redo."""

    def call(worker):
        ray.get(worker.load_weights.remote(version, ref, checksum))
        return worker.rollout.remote(iteration, prompts, *reward_args)

    return call


def _summarise(batches, stats: dict) -> dict:
    out: dict = {}
    for name in batches[0].leaf_rewards:
        train_vals, anchor_vals, per_g = [], [], {}
        for b in batches:
            r = b.leaf_rewards[name]
            kind = "branch" if b.plan.algorithm == "g2rpo" else "sample"
            grid = b.plan.gather(r, kind)
            train_vals.append(grid.flatten())
            anchor_vals.append(b.plan.gather(r, "anchor").flatten())
            if kind == "branch":
                for gi, g in enumerate(b.plan.granularities):
                    per_g.setdefault(str(g), []).append(grid[:, :, gi].flatten())
        out[f"reward/{name}"] = float(torch.cat(train_vals).mean())
        out[f"anchor_reward/{name}"] = float(torch.cat(anchor_vals).mean())
        for g, vals in per_g.items():
            out[f"reward/{name}/g{g}"] = float(torch.cat(vals).mean())
    out.update(stats)
    out["nfe"] = sum(b.nfe for b in batches)
    out["model_calls"] = sum(b.model_calls for b in batches)
    out["weight_versions"] = sorted({b.version for b in batches})
    return out


def train(
    config: str | Path | None,
    overrides: list[str],
    *,
    resume: str | Path | None = None,
    redis_url: str | None = None,
    progress: bool = True,
    max_iterations: int | None = None,
) -> Path:
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.yaml").is_file():
            raise ValueError(f"--resume {run_dir}: no config.yaml there (not a run directory)")
        cfg = load_config(run_dir / "config.yaml", overrides)
    else:
        cfg = load_config(config, overrides)
        run_dir = Path(cfg.run.output_dir) / cfg.run.name
        if (run_dir / "metrics.jsonl").exists():
            raise ValueError(
                f"{run_dir} already holds a run: pass --resume {run_dir} or another run.name"
            )
        (run_dir / CKPT).mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(dump_config(cfg))
    cfg.model.check_trainable()  # before any actor loads a model
    train_prompts, eval_prompts = _prompts(cfg.train.prompts), _prompts(cfg.train.eval_prompts)
    eval_prompts = eval_prompts[: cfg.train.eval_samples]

    actors = start_actors(cfg, redis_url)
    try:
        return _loop(
            cfg,
            run_dir,
            actors,
            (train_prompts, eval_prompts),
            resume=resume is not None,
            progress=progress,
            max_iterations=max_iterations,
        )
    finally:
        actors.stop()


def _loop(
    cfg: G2RPOConfig,
    run_dir: Path,
    actors: RunActors,
    prompt_sets,
    *,
    resume: bool,
    progress: bool,
    max_iterations: int | None,
) -> Path:
    """Resume point, then iterations: publish, evaluate, roll out, update, record."""
    learner, workers, rewards = actors.learner, actors.workers, actors.rewards
    train_prompts, eval_prompts = prompt_sets
    start = 0
    metrics_path = run_dir / "metrics.jsonl"
    if resume:
        ckpt = _latest_checkpoint(run_dir)
        if ckpt is not None:
            start = ray.get(learner.load.remote(str(ckpt)))
        if start > cfg.run.iterations:
            raise ValueError(
                f"run.iterations={cfg.run.iterations}: the run's checkpoint is already at "
                f"iteration {start}; resume with --set run.iterations=N for N >= {start}"
            )
        kept = [
            ln
            for ln in (metrics_path.read_text().splitlines() if metrics_path.exists() else [])
            if json.loads(ln)["iteration"] < start
        ]
        metrics_path.write_text("".join(ln + "\n" for ln in kept))
    end = (
        cfg.run.iterations
        if max_iterations is None
        else min(cfg.run.iterations, start + max_iterations)
    )
    P = cfg.sampling.prompts_per_worker
    exporter = status = None
    if cfg.train.metrics_port is not None:
        from .telemetry import TrainingExporter

        exporter = TrainingExporter(cfg.train.metrics_port)
        (run_dir / "metrics_port").write_text(f"{exporter.port}\n")
    if rewards.redis_url:
        from .telemetry import RedisStatus

        status = RedisStatus(rewards.redis_url, cfg.run.name)
    bar = tqdm(
        range(start, end),
        desc=f"train {cfg.run.name}",
        disable=not progress,
        initial=start,
        total=cfg.run.iterations,
    )
    done = start
    try:
        for it in bar:
            t0 = time.perf_counter()
            version, (ref,), checksum, nbytes = ray.get(learner.publish.remote())
            rewards.refresh(timeout=cfg.train.placement_timeout_s)
            loaded = []
            for i, pending in enumerate(
                [w.load_weights.remote(version, ref, checksum) for w in workers]
            ):
                try:
                    loaded.append(ray.get(pending))
                except ray.exceptions.RayActorError:  # restarted by Ray: load again
                    loaded.append(_get_with_retry(_load_call(version, ref, checksum), workers, i))
            for i, got in enumerate(loaded):
                if got != (version, checksum):
                    raise RuntimeError(f"worker {i} loaded {got}, expected {(version, checksum)}")
            t1 = time.perf_counter()
            record_actors(run_dir, actors)  # outside the timed phases
            row: dict = {"iteration": it, "version": version, "weights_bytes": nbytes}
            if it % cfg.train.eval_every == 0 or it == end - 1:
                images, scores = _get_with_retry(
                    lambda w: w.evaluate.remote(
                        eval_prompts, cfg.run.seed + 10_000, *rewards.args()
                    ),
                    workers,
                    0,
                )
                for name, vals in scores.items():
                    row[f"eval/{name}"] = float(np.mean(vals))
                if it % cfg.train.checkpoint_every == 0 or it == end - 1:
                    _grid(run_dir / "samples" / f"it_{it:05d}.png", images, eval_prompts)
            t2 = time.perf_counter()
            prompts = prompts_for(train_prompts, cfg.run.seed, it, P * len(workers))
            shares = [prompts[i * P : (i + 1) * P] for i in range(len(workers))]
            refs = [
                w.rollout.remote(it, sh, *rewards.args())
                for w, sh in zip(workers, shares, strict=True)
            ]
            results = []
            for i, r in enumerate(refs):
                try:
                    results.append(ray.get(r))
                except ray.exceptions.RayActorError:  # Ray restarts the actor; redo its share
                    redo = _redo(version, ref, checksum, it, shares[i], rewards.args())
                    results.append(_get_with_retry(redo, workers, i))
            t3 = time.perf_counter()
            stats = ray.get(learner.update.remote(*results))
            t4 = time.perf_counter()
            row.update(_summarise(results, stats))
            row["time/weight_push_s"] = t1 - t0
            row["time/eval_s"] = t2 - t1
            row["time/rollout_s"] = max(b.timings["rollout_s"] for b in results)
            row["time/reward_s"] = max(b.timings["reward_s"] for b in results)
            row["time/rollout_and_reward_s"] = t3 - t2
            row["time/learn_s"] = t4 - t3
            row["time/iteration_s"] = t4 - t0
            with metrics_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if exporter is not None:
                exporter.observe(row)
            if status is not None:
                status.publish(row, run_dir, "running" if it + 1 < end else "finished")
            done = it + 1
            if done % cfg.train.checkpoint_every == 0 or done == end:
                ray.get(learner.save.remote(str(run_dir / CKPT / f"it_{done:05d}.pt")))
                _plot(run_dir, cfg.run.name)
            main = cfg.rewards[0].name
            bar.set_postfix(
                reward=f"{row[f'reward/{main}']:.3f}",
                loss=f"{row['loss']:.2e}",
                it_s=f"{row['time/iteration_s']:.1f}",
            )
        # this session trained the last iteration, or an earlier one stopped before
        # its export: final/ gets (or replaces) the trained weights
        if done == cfg.run.iterations and (done > start or not (run_dir / "final").exists()):
            _export(learner, run_dir)
    except KeyboardInterrupt:
        ray.get(learner.save.remote(str(run_dir / CKPT / f"it_{done:05d}.pt")))
        print(
            f"\ninterrupted after iteration {done}; resume with: g2rpo train --resume {run_dir}",
            file=sys.stderr,
        )
        raise
    finally:
        if exporter is not None:
            exporter.close()
    return run_dir


def _plot(run_dir: Path, name: str) -> None:
    from .plots import plot_curves

    try:
        plot_curves(read_metrics(run_dir), run_dir / "curves.png", title=name)
    except Exception as exc:  # a picture must never end a run
        print(f"could not draw {run_dir / 'curves.png'}: {exc}", file=sys.stderr)


def _export(learner, run_dir: Path) -> None:
    """The trained weights in a diffusers layout under final/, written aside and
    swapped in, so a final/ that exists is always complete."""
    import shutil

    final, partial, old = (run_dir / n for n in ("final", "final.partial", "final.old"))
    shutil.rmtree(partial, ignore_errors=True)
    ray.get(learner.export.remote(str(partial)))
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    partial.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _grid(path: Path, images: np.ndarray, prompts: list[str], per_row: int = 8) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    n = min(len(images), 32)
    h, w = images.shape[1:3]
    rows = (n + per_row - 1) // per_row
    grid = Image.new("RGB", (per_row * (w * 3 + 2), rows * (h * 3 + 2)), "white")
    for i in range(n):
        tile = Image.fromarray(images[i]).resize((w * 3, h * 3), Image.NEAREST)
        grid.paste(tile, ((i % per_row) * (w * 3 + 2), (i // per_row) * (h * 3 + 2)))
    grid.save(path)
    (path.with_suffix(".txt")).write_text("\n".join(prompts[:n]) + "\n")


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
