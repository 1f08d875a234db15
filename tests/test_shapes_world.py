import numpy as np
import pytest
from g2rpo.common.prompts.shapes import (
    COLOURS,
    SHAPES,
    ShapeSpec,
    all_combinations,
    parse_prompt,
    render,
    render_batch,
    split_combinations,
)
from g2rpo.reward_server.scorers.base import BadInput, Scorer
from g2rpo.reward_server.scorers.jpeg import JpegCompressibility
from g2rpo.reward_server.scorers.registry import make_scorer
from g2rpo.reward_server.scorers.shapes_oracle import ShapesOracle, check_image


def test_combinations_and_held_out_split():
    combos = all_combinations()
    assert len(combos) == 5 * 8 * 7 == 280 and len(set(combos)) == 280
    train, held = split_combinations(seed=0, held_out=40)
    assert len(train) == 240 and len(held) == 40
    assert not set(train) & set(held)
    assert split_combinations(seed=0) == (train, held)
    assert split_combinations(seed=1)[1] != held
    # every shape and colour still appears in training
    assert {s.shape for s in train} == set(SHAPES) and {s.fg for s in train} == set(COLOURS)


def test_prompts_round_trip_and_bad_prompts_are_named():
    for spec in all_combinations():
        assert parse_prompt(spec.prompt) == spec
    assert parse_prompt("an orange circle on a blue background").fg == "orange"
    with pytest.raises(ValueError, match="not a shapes-world prompt"):
        parse_prompt("a photo of a cat")
    with pytest.raises(ValueError, match="shape must be one of"):
        parse_prompt("a red hexagon on a blue background")
    with pytest.raises(ValueError, match="both 'red'"):
        ShapeSpec("circle", "red", "red")


def test_rendering_is_deterministic_and_coloured():
    specs = all_combinations()[:50]
    a, b = render_batch(specs, seed=3), render_batch(specs, seed=3)
    assert a.dtype == np.uint8 and a.shape == (50, 32, 32, 3)
    assert np.array_equal(a, b) and not np.array_equal(a, render_batch(specs, seed=4))
    img = render(ShapeSpec("square", "red", "blue"), np.random.default_rng(0), size=64)
    assert img.shape == (64, 64, 3)
    assert tuple(img[0, 0]) == (40, 80, 220)  # corners are background
    assert ((img == (220, 40, 40)).all(-1)).sum() > 64 * 64 * 0.2**2  # a solid red patch


def test_oracle_is_exact_on_renders_and_near_chance_on_mismatches():
    specs = [all_combinations()[i % 280] for i in range(560)]
    imgs = render_batch(specs, seed=11)
    oracle = ShapesOracle()
    assert isinstance(oracle, Scorer)
    checks = oracle.checks(imgs, [s.prompt for s in specs])
    assert all(c.passed for c in checks)
    assert np.array_equal(oracle.score(imgs, [s.prompt for s in specs]), np.ones(560, np.float32))
    perm = np.random.default_rng(0).permutation(560)
    wrong = oracle.checks(imgs, [specs[i].prompt for i in perm])
    assert np.mean([c.passed for c in wrong]) < 0.03
    assert 0.12 < np.mean([c.shape_ok for c in wrong]) < 0.3  # chance is 1/5


def test_strict_pass_is_the_oracles_pass_as_a_zero_one_reward():
    specs = [all_combinations()[i] for i in range(0, 280, 7)]
    imgs = render_batch(specs, seed=3)
    prompts = [s.prompt for s in specs]
    strict = make_scorer("shapes_strict")
    assert strict.name == "shapes_strict" and isinstance(strict, Scorer)
    assert np.array_equal(strict.score(imgs, prompts), np.ones(len(specs), np.float32))
    # a blank image meets one criterion of three: the oracle gives 1/3, strict 0
    blank = np.full((1, 32, 32, 3), 245, np.uint8)
    prompt = ["a red circle on a white background"]
    assert ShapesOracle().score(blank, prompt)[0] == pytest.approx(1 / 3)
    assert strict.score(blank, prompt).tolist() == [0.0]
    perm = np.random.default_rng(0).permutation(len(specs))
    wrong = [prompts[i] for i in perm]  # mismatched prompts: partial credit or none
    got, soft = strict.score(imgs, wrong), ShapesOracle().score(imgs, wrong)
    assert got.dtype == np.float32 and set(got.tolist()) <= {0.0, 1.0}
    assert ((soft > 0) & (soft < 1)).any()  # partial credit there, and strict gives it none
    assert np.array_equal(got, (soft == 1.0).astype(np.float32))


def test_oracle_on_a_blank_image():
    blank = np.full((32, 32, 3), 245, np.uint8)
    c = check_image(blank, "a red circle on a white background")
    assert c.bg_ok and not c.fg_ok and c.shape is None and c.score == pytest.approx(1 / 3)


def test_jpeg_compressibility_prefers_flat_images():
    flat = np.full((4, 32, 32, 3), 128, np.uint8)
    noisy = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    scorer = JpegCompressibility()
    s_flat, s_noisy = scorer.score(flat, [""] * 4), scorer.score(noisy, [""] * 4)
    assert s_flat.dtype == np.float32 and np.all(s_flat > s_noisy) and np.all(s_flat < 0)


@pytest.mark.parametrize(
    ("images", "prompts", "needle"),
    [
        (np.zeros((2, 8, 8, 3), np.float32), ["a", "b"], "dtype must be uint8"),
        (np.zeros((2, 8, 8), np.uint8), ["a", "b"], "shape must be"),
        (np.zeros((2, 8, 8, 3), np.uint8), ["a"], "1 prompts for 2 images"),
        (np.zeros((1, 8, 8, 3), np.uint8), [3], "list of strings"),
    ],
)
def test_scorers_reject_bad_batches(images, prompts, needle):
    for scorer in (JpegCompressibility(), ShapesOracle()):
        with pytest.raises(BadInput, match=needle):
            scorer.score(images, prompts)
    with pytest.raises(BadInput, match="prompts: not a shapes-world prompt"):
        ShapesOracle().score(np.zeros((1, 8, 8, 3), np.uint8), ["hello"])
