"""An evaluation spread over the rollout workers (``train.eval.on_actor: false``): each
worker samples a contiguous slice with the noise that slice has in the whole evaluation,
so the slices together are the evaluation one actor would make."""

from __future__ import annotations

import numpy as np
import pytest
from g2rpo.orchestration.evaluations import eval_slices


@pytest.mark.parametrize(("total", "parts"), [(400, 16), (8, 2), (5, 3), (3, 7), (1, 1)])
def test_slices_cover_the_evaluation_in_order(total, parts):
    slices = eval_slices(total, parts)
    assert len(slices) == min(total, parts)
    assert [f for f, _ in slices] == np.cumsum([0, *[c for _, c in slices][:-1]]).tolist()
    assert sum(c for _, c in slices) == total
    assert max(c for _, c in slices) - min(c for _, c in slices) <= 1


def test_a_slice_samples_what_the_whole_evaluation_samples_there(world):
    from g2rpo.common.config.loading import load_config
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    cfg = load_config(
        None,
        [
            f"model.pretrained={world / 'pipeline'}",
            "train.image_size=32",
            "sampling.num_steps=6",
            "sampling.sde_steps=[0]",
        ],
    )
    worker = RolloutWorkerCore(cfg, 0)
    prompts = [
        "a red circle on a blue background",
        "a green square on a yellow background",
        "a white cross on a black background",
        "a blue diamond on a white background",
        "a purple triangle on an orange background",
    ]
    whole = worker.eval_images(prompts, seed=11)
    parts = [
        worker.eval_images(prompts[f : f + c], seed=11, first=f, total=len(prompts))
        for f, c in eval_slices(len(prompts), 2)
    ]
    spread = np.concatenate(parts)
    # the same noise per sample; a different batch may move a pixel by one level
    assert spread.shape == whole.shape
    assert np.abs(spread.astype(int) - whole.astype(int)).max() <= 1
    # and not merely the first rows' noise again
    alone = worker.eval_images(prompts[3:], seed=11)
    assert np.abs(alone.astype(int) - whole[3:].astype(int)).max() > 10
