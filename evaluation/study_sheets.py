"""The readers' sheets of the pre-registered hacking study
(docs/results/hacking/preregistration.md, "Labels"): for each run, one page per evaluation
after the first holding ALL its samples, each beside the base evaluation's sample of the
same noise, enlarged, with nothing else on the page (no measure, reward, method or seed).
Runs are named by a random 6-hex id and listed in a random order; the key from ids to runs
is written beside the sheets' folder, never inside it.

    g2rpo hacking sheets RUN_DIR... --out SHEETS_DIR [--seed N]
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

SCALE = 2  # px per image px: 32² samples become 64² tiles
GAP = 6  # px between the base's samples and this evaluation's, and between columns
COLUMNS = 2  # the prompts in two columns: a page stays about as wide as it is tall


def kept_evaluations(run: Path) -> list[tuple[int, Path]]:
    """(iteration, images file) of every evaluation that kept its images, in order."""
    from ..run_directory.files import iteration_of

    return [(iteration_of(p), p) for p in sorted(run.glob("evals/it_*.images.npz"))]


def _tile(image: np.ndarray) -> np.ndarray:
    return image.repeat(SCALE, axis=0).repeat(SCALE, axis=1)


def page(base: np.ndarray, now: np.ndarray, per_prompt: int) -> np.ndarray:
    """uint8 [H, W, 3]: prompt by prompt (rows, in ``COLUMNS`` columns), the base's
    ``per_prompt`` samples, a gap, this evaluation's, on white."""
    n, h, w, _ = now.shape
    prompts = n // per_prompt
    rows = -(-prompts // COLUMNS)
    th, tw = h * SCALE, w * SCALE
    block_w = 2 * per_prompt * tw + GAP
    canvas = np.full((rows * (th + 2), COLUMNS * (block_w + 3 * GAP), 3), 255, np.uint8)
    for p in range(prompts):
        col, row = divmod(p, rows)
        y, x0 = row * (th + 2), col * (block_w + 3 * GAP)
        for j in range(per_prompt):
            i = p * per_prompt + j
            canvas[y : y + th, x0 + j * tw : x0 + (j + 1) * tw] = _tile(base[i])
            x = x0 + per_prompt * tw + GAP + j * tw
            canvas[y : y + th, x : x + tw] = _tile(now[i])
    return canvas


def write_sheets(runs: list[Path], out: Path, seed: int = 0) -> Path:
    """The sheets of ``runs`` under ``out`` (``out/<id>/evaluation_NN.png``, NN counting
    from 1 after the base, and ``out/READ_IN_THIS_ORDER.txt``); returns the key file,
    ``out``'s sibling ``<out name>.key.json``: {id: run directory}."""
    from PIL import Image

    rng = random.Random(seed)
    ids = {}
    for run in runs:
        while (run_id := f"{rng.getrandbits(24):06x}") in ids:
            pass
        ids[run_id] = run
    out.mkdir(parents=True, exist_ok=True)
    for run_id, run in ids.items():
        evaluations = kept_evaluations(run)
        if len(evaluations) < 2:
            raise FileNotFoundError(
                f"{run}: fewer than 2 evaluations kept their images (train.eval.keep_images)"
            )
        per_prompt = json.loads((run / "evals" / f"it_{evaluations[0][0]:05d}.json").read_text())[
            "per_prompt"
        ]
        base = np.load(evaluations[0][1])["images"]
        (out / run_id).mkdir(exist_ok=True)
        for k, (_, path) in enumerate(evaluations[1:], start=1):
            sheet = page(base, np.load(path)["images"], per_prompt)
            Image.fromarray(sheet).save(out / run_id / f"evaluation_{k:02d}.png", optimize=True)
    order = list(ids)
    rng.shuffle(order)
    (out / "READ_IN_THIS_ORDER.txt").write_text("\n".join(order) + "\n")
    key = out.parent / f"{out.name}.key.json"
    key.write_text(json.dumps({i: str(r) for i, r in ids.items()}, indent=1) + "\n")
    return key
