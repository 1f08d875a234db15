"""Write ``planning/presets/traces.json``: every trace the plans users run first need.

``python -m g2rpo.planning.ship_traces`` plans, with the shipped table switched off
and an empty cache (so each shape is traced now, on fake tensors), every shipped FLUX
recipe and README's one-GPU learner of the official script (with and without its
gradient checkpointing), at 80 and 141 GiB, remedies included, and ships what they
traced. Run it again after a change to the tracing code or the FLUX presets (bump
``trace.CACHE_VERSION`` when the change alters what a trace measures);
``tests/test_plan.py`` checks that the table covers these plans and that a shipped
entry equals a fresh trace. Takes several minutes on 2 cores."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from unittest.mock import patch

ROOT = Path(__file__).resolve().parents[1]
GPU_MEMORY_GIB = (80.0, 141.0)  # H100/A100 80GB and H200
OFFICIAL_ONE_GPU = [  # README: the official script's learner on one GPU
    "train.learner.count=1",
    "model.mixed_precision=autocast",
    "model.rollout_weights_dtype=float32",
]


def shipped_plans() -> list[tuple[Path, list[str], float]]:
    """(config, overrides, GiB per GPU) of every plan the table answers without tracing."""
    flux = sorted((ROOT / "configs").glob("*flux*.yaml"))
    flux += sorted((ROOT / "configs").glob("*sd35*.yaml"))
    flux += sorted((ROOT / "configs").glob("*qwenimage*.yaml"))
    hps = ROOT / "configs" / "flux_hps.yaml"
    settings = [(path, []) for path in flux]
    settings += [
        (hps, OFFICIAL_ONE_GPU),
        (hps, [*OFFICIAL_ONE_GPU, "model.gradient_checkpointing=false"]),
    ]
    return [(path, over, gib) for path, over in settings for gib in GPU_MEMORY_GIB]


def trace_shipped_plans(progress: bool = True) -> list[dict]:
    """Trace every shipped plan now; returns the table's entries, sorted by key."""
    from tqdm.auto import tqdm

    from ..common.config.loading import load_config
    from . import trace
    from .calibration import calibration
    from .check import report
    from .timing import estimate_time

    with tempfile.TemporaryDirectory() as cache:
        # the environment as it was once done (patch.dict restores it)
        with patch.dict(os.environ, G2RPO_PLAN_SHIPPED="0", G2RPO_PLAN_CACHE=cache):
            trace.shipped_traces.cache_clear()
            try:
                for path, over, gib in tqdm(shipped_plans(), desc="plans", disable=not progress):
                    cfg = load_config(path, over)
                    report(cfg, gib)  # the plan and its remedies' plans
                    estimate_time(cfg, calibration("H200"))  # its FLOP counts
            finally:
                trace.shipped_traces.cache_clear()
        entries = [json.loads(f.read_text()) for f in sorted(Path(cache).glob("*.json"))]
    return sorted(entries, key=lambda e: e["key"])


def main() -> int:
    import torch

    from . import trace

    entries = trace_shipped_plans()
    out = Path(__file__).parent / "presets" / trace.SHIPPED
    table = {
        "written_by": "python -m g2rpo.planning.ship_traces",
        "torch": torch.__version__.split("+")[0],
        "traces": entries,
    }
    out.write_text(json.dumps(table, indent=0) + "\n")
    print(f"wrote {len(entries)} traces to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
