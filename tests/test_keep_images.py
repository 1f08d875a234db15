"""`train.eval.keep_images`: every evaluation image kept for a study that measures them
afterwards (docs/results/hacking/preregistration.md), while the driver still gets only the
sample grid's images back when it is off."""

from __future__ import annotations

import numpy as np
from g2rpo.common.config.loading import load_config
from g2rpo.common.wire.messages import EvalSamples
from g2rpo.orchestration.evaluations import returned_samples, set_images_aside
from g2rpo.run_directory.files import grid_samples


def test_only_the_grid_comes_back_unless_every_image_is_kept():
    # caught: before keep_images the evaluation had no way to return more than the grid's
    cfg = load_config("configs/tiny.yaml")
    assert returned_samples(160, cfg.train.eval) == grid_samples(160, 4)
    assert len(grid_samples(160, 4)) == 32
    kept = load_config("configs/tiny.yaml", ["train.eval.keep_images=true"])
    assert returned_samples(160, kept.train.eval) == list(range(160))


def test_kept_images_are_saved_whole_and_the_grid_goes_on(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (160, 32, 32, 3), dtype=np.uint8)
    samples = EvalSamples(images, {"s": [0.0] * 160}, 1.0, 3)
    shown = set_images_aside(tmp_path, 7, samples, per_prompt=4)
    saved = np.load(tmp_path / "evals" / "it_00007.images.npz")["images"]
    assert np.array_equal(saved, images)  # every image, bit for bit
    assert np.array_equal(shown.images, images[grid_samples(160, 4)])
    assert shown.scores == samples.scores and shown.version == 3
    assert [p.name for p in (tmp_path / "evals").iterdir()] == ["it_00007.images.npz"]
