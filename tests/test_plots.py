"""The run's curves PNG from metrics rows."""

import numpy as np
import pytest
from g2rpo.run_directory.plots import plot_curves
from PIL import Image


def _rows(n=4):
    rows = []
    for it in range(n):
        row = {"iteration": it, "version": it, "loss": 1e-5 * (-1) ** it, "grad_norm": 0.1 + it}
        row.update({"ratio_min": 0.999, "ratio_mean": 1.0, "ratio_max": 1.001})
        row.update({"clip_fraction": 0.1, "weight_versions": [it]})
        for name in ("shapes_clip", "shapes_oracle"):
            row[f"reward/{name}"] = 0.5 + 0.1 * it
            row[f"reward/{name}/g1"] = 0.5
            row[f"anchor_reward/{name}"] = 0.4 + 0.1 * it
        if it % 2 == 0:  # evaluation only on some iterations
            row["eval/shapes_clip"] = 0.3 + 0.1 * it
        for phase in ("weight_push", "eval", "rollout", "reward", "learn"):
            row[f"time/{phase}_s"] = 0.5
        rows.append(row)
    return rows


def test_curves_png_is_drawn_from_rows(tmp_path):
    path = plot_curves(_rows(), tmp_path / "sub" / "curves.png", title="demo")
    image = np.asarray(Image.open(path).convert("L"))
    assert image.shape == (7 * 80, 11 * 80)
    assert image.std() > 10  # drawn, not blank


def test_no_rows_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no metrics rows"):
        plot_curves([], tmp_path / "curves.png")


def test_grid_labels_the_default_font_cannot_draw_are_written_in_ascii(tmp_path):
    """PIL's default font draws a box for "²" or "Λ": a method's label is drawn as the
    same pixels as its ASCII spelling."""
    import numpy as np
    from g2rpo.run_directory.grids import labelled_grid
    from PIL import Image

    tiles = np.zeros((1, 1, 4, 4, 3), np.uint8)
    fancy = labelled_grid(tmp_path / "a.png", ["η 0.7"], [("G²RPO, Λ = {2}", tiles)], title="Δ")
    plain = labelled_grid(tmp_path / "b.png", ["eta 0.7"], [("G2RPO, L = {2}", tiles)], title="d")
    assert np.array_equal(np.asarray(Image.open(fancy)), np.asarray(Image.open(plain)))
