"""``g2rpo hacking``: checks of the reward-hacking measures. One subcommand per check
(``photos``: evaluation/photo_check.py); a new check adds its parser in
``add_hacking_parsers``."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from g2rpo.cli_args import int_list
from g2rpo.common.errors import UsageError


def git_commit(where: Path) -> tuple[str | None, bool]:
    """The checkout's commit and whether it has uncommitted changes (None outside git)."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None, False
    return commit, bool(status.strip())


def _cmd_photos(args: argparse.Namespace) -> int:
    from g2rpo.evaluation.photo_check import PhotoCheckSettings, run_check
    from g2rpo.evaluation.photo_sets import SetLevelSettings, add_set_level
    from g2rpo.evaluation.photo_table import write_outputs

    if any(s < 64 for s in args.sizes or []):
        raise UsageError(f"--sizes {args.sizes}: each side must be at least 64 px")
    if args.quick:
        settings = PhotoCheckSettings.quick(args.sizes, args.seed)
    else:
        settings = PhotoCheckSettings(
            seed=args.seed, **({"sizes": args.sizes} if args.sizes else {})
        )
    results = run_check(settings, progress=not args.no_progress)
    set_settings = SetLevelSettings.quick() if args.quick else SetLevelSettings()
    results = add_set_level(results, set_settings)  # the guard's decision shape, beside per image
    commit, dirty = git_commit(Path(__file__).resolve().parent)
    command = f"g2rpo hacking photos --out {args.out} --seed {args.seed}"
    command += f" --sizes {','.join(map(str, settings.sizes))}" + (" --quick" if args.quick else "")
    results = {"command": command, "git_commit": commit, "git_dirty": dirty, **results}
    paths = write_outputs(results, Path(args.out))
    for size, g in results["goal"].items():
        strong = ", ".join(f"{h} {v:.0%}" for h, v in g["strong_tied_detection"].items())
        print(
            f"{size}²: strong hacks detected {strong}; clean false alarms {g['false_alarm']:.1%} "
            f"(groups {g['false_alarm_groups']:.1%}): goal {'met' if g['met'] else 'NOT met'}"
        )
    for size, g in results["set_level"]["goal"].items():
        fa = results["set_level"]["per_size"][size]["false_alarm"]["overall"]["rate"]
        found = all(v == 1.0 for v in g["strong_tied_detection"].values())
        print(
            f"{size}² set level: every strong hack found {found}; clean set trials flagged "
            f"{fa:.1%}: goal (image measures) {'met' if g['met_image_measures'] else 'NOT met'}"
        )
    print(f"wrote {', '.join(str(p) for p in paths)} in {results['wall_s']:.0f} s")
    return 0


def add_hacking_parsers(sub) -> None:
    hacking = sub.add_parser("hacking", help="checks of the reward-hacking measures")
    checks = hacking.add_subparsers(dest="hacking_cmd", required=True, metavar="CHECK")
    photos = checks.add_parser(
        "photos",
        help="the image-health measures on photographs with known hacks vs clean variations",
        description="scikit-image's photographs at each size, given known hacks (saturation "
        "push, over-sharpening, a 16-px patch grid, a faint periodic texture, a text overlay, "
        "collapse to near-duplicates) at mild and strong strength, and clean variations "
        "(crops, rescales, colour and exposure jitter, JPEG, other photographs). Thresholds "
        "are calibrated on some photographs' clean variations and judged on the others'.",
    )
    photos.add_argument(
        "--out", required=True, help="directory for results.json, table.md, detection.png"
    )
    photos.add_argument(
        "--sizes", type=int_list, default=None, help="sides in px (default 512,720,1024)"
    )
    photos.add_argument("--seed", type=int, default=0)
    photos.add_argument(
        "--quick", action="store_true", help="a test-sized check (256², 8 photographs)"
    )
    photos.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    photos.set_defaults(func=_cmd_photos)
    from g2rpo.cli_study import add_study_parsers

    add_study_parsers(checks)
