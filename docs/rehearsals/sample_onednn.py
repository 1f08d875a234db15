"""Seconds per held-out sample by a rehearsal's rollout-worker core (its encode, engine
and decode parts: the sampling of `RolloutWorkerCore.eval_images`, unscored), with
oneDNN's convolutions and without (``torch.backends.mkldnn.enabled``), one thread, 24
prompts, alternating twice. Behind docs/rehearsals.md, "Where a rehearsal's time goes":

    .venv/bin/python docs/rehearsals/sample_onednn.py REHEARSAL_OUT

(REHEARSAL_OUT: a `g2rpo rehearse --out` folder: its rehearsal.yaml and shared models)."""

from __future__ import annotations

import sys
import time

import torch
from g2rpo.common.config.loading import load_config
from g2rpo.rollout_worker.plan import anchor_plan
from g2rpo.rollout_worker.worker import RolloutWorkerCore

cfg = load_config(f"{sys.argv[1]}/rehearsal.yaml", [])
core = RolloutWorkerCore(cfg, 0)
prompts = [f"a photo of thing {i}" for i in range(24)]
core.eval_images(prompts[:2], 0)  # the first call's one-time costs
for onednn in (True, False, True, False):
    torch.backends.mkldnn.enabled = onednn
    parts: dict[str, float] = {}
    t0 = time.perf_counter()
    plan = anchor_plan(len(prompts), cfg.sampling.num_steps)
    core._sample(plan, prompts, torch.Generator().manual_seed(0), timings=parts)
    each = {k: round(v / len(prompts), 3) for k, v in parts.items()}
    print(
        f"oneDNN {'on ' if onednn else 'off'}: "
        f"{(time.perf_counter() - t0) / len(prompts):.3f} s a sample; per sample {each}"
    )
