import time

import numpy as np
import pytest
import torch
from g2rpo.common.families.loaders import ModelPathError, resolve_local_dir
from g2rpo.reward_server.random_models import random_clip_dir
from g2rpo.reward_server.scorers.clip_score import ClipScore


@pytest.fixture(scope="module")
def tiny_clip_dir(tmp_path_factory):
    """A random tiny CLIP saved in the real transformers layout (no download)."""
    return random_clip_dir(tmp_path_factory.mktemp("clip") / "tiny_clip", "tiny")


def _images(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)


def test_clip_score_from_local_dir(tiny_clip_dir):
    scorer = ClipScore(tiny_clip_dir)
    prompts = ["a red circle on a blue background", "a green square on a black background"] * 3
    s = scorer.score(_images(6), prompts)
    assert s.shape == (6,) and s.dtype == np.float32
    assert np.all(np.abs(s) <= 1.0 + 1e-5)
    assert np.array_equal(s, scorer.score(_images(6), prompts))  # deterministic
    # batching does not change the scores
    small = ClipScore(tiny_clip_dir, batch_size=4)
    assert np.array_equal(small.score(_images(6), prompts), s)
    assert scorer.version.startswith(tiny_clip_dir.name)


def test_a_score_does_not_depend_on_the_company_its_image_came_in(tiny_clip_dir):
    """The reward server's batcher merges whichever requests arrive together: an image
    scored alone, beside its group or beside another request's images and prompts
    (longer ones: the text is not padded to them) gets the same bits, so a resumed or
    restarted run reproduces its scores exactly (1e-7 apart before: small calls took
    other matrix kernels)."""
    scorer = ClipScore(tiny_clip_dir)
    imgs = _images(12, seed=3)
    prompts = ["a red circle on a blue background"] * 6 + ["a big green square"] * 6
    together = scorer.score(imgs, prompts)
    alone = np.concatenate([scorer.score(imgs[i : i + 1], prompts[i : i + 1]) for i in range(12)])
    assert np.array_equal(alone, together)
    pairs = np.concatenate(
        [scorer.score(imgs[i : i + 2], prompts[i : i + 2]) for i in range(0, 12, 2)]
    )
    assert np.array_equal(pairs, together)
    other = ["a small yellow triangle on a purple background, drawn in the middle"] * 3
    merged = scorer.score(np.concatenate([imgs[:1], _images(3, seed=4)]), prompts[:1] + other)
    assert merged[0] == together[0]
    fresh = ClipScore(tiny_clip_dir)  # a restarted server: nothing cached
    assert np.array_equal(fresh.score(imgs[5:7], prompts[5:7]), together[5:7])


def test_pickscore_is_scaled_cosine(tiny_clip_dir):
    cos = ClipScore(tiny_clip_dir)
    pick = ClipScore(tiny_clip_dir, name="pickscore", scale="logit")
    scale = float(pick.model.logit_scale.detach().exp())
    prompts = ["a red circle on a blue background"] * 2
    assert np.allclose(
        pick.score(_images(2), prompts), scale * cos.score(_images(2), prompts), rtol=1e-5
    )
    assert pick.name == "pickscore"


def test_hub_id_and_missing_paths_fail_fast(tmp_path):
    start = time.perf_counter()
    with pytest.raises(ModelPathError, match="hub id") as err:
        ClipScore("openai/clip-vit-base-patch32")
    assert "openai/clip-vit-base-patch32" in str(err.value)
    with pytest.raises(ModelPathError, match="does not exist"):
        ClipScore(tmp_path / "nothing")
    with pytest.raises(ModelPathError, match=r"lacks config\.json"):
        ClipScore(tmp_path)
    assert time.perf_counter() - start < 5  # no network wait
    with pytest.raises(ModelPathError, match="not a directory"):
        (tmp_path / "f").write_text("x")
        resolve_local_dir(tmp_path / "f", "thing")


def test_registry(tiny_clip_dir):
    from g2rpo.reward_server.scorers.registry import make_scorer, scorer_names

    assert {"shapes_oracle", "jpeg_compressibility", "shapes_clip", "pickscore"} <= set(
        scorer_names()
    )
    assert make_scorer("jpeg_compressibility").name == "jpeg_compressibility"
    pick = make_scorer("pickscore", path=tiny_clip_dir)
    assert pick.name == "pickscore" and pick.scale == "logit"
    with pytest.raises(ValueError, match="unknown scorer 'hps'"):
        make_scorer("hps")
    with pytest.raises(ValueError, match="needs path="):
        make_scorer("clip_score")
    with pytest.raises(ValueError, match="'hpsv2' needs path="):
        make_scorer("hpsv2")
    with pytest.raises(ValueError, match="convert-reward hpsv2"):  # the original .pt, unconverted
        (tiny_clip_dir.parent / "HPS_v2.1_compressed.pt").write_bytes(b"")
        make_scorer("hpsv2", path=tiny_clip_dir.parent / "HPS_v2.1_compressed.pt")
    hps = make_scorer("hpsv2", path=tiny_clip_dir)  # a converted dir is a CLIPModel dir
    assert hps.name == "hpsv2" and hps.scale == "cosine"


def test_fast_paths_match_the_processor_and_model_forward(tiny_clip_dir):
    from PIL import Image

    scorer = ClipScore(tiny_clip_dir)
    imgs = _images(5)
    fast = scorer._pixels(imgs)
    slow = scorer.processor(images=[Image.fromarray(i) for i in imgs], return_tensors="pt")
    assert torch.allclose(fast, slow["pixel_values"], atol=1e-5)
    prompts = ["a red circle", "a blue square", "a red circle", "x", "a blue square"]
    with torch.no_grad():
        ref = scorer.model(
            **scorer.processor(
                text=prompts,
                images=[Image.fromarray(i) for i in imgs],
                return_tensors="pt",
                padding=True,
            )
        )
    expect = (ref.image_embeds * ref.text_embeds).sum(-1).numpy()
    assert np.allclose(scorer.score(imgs, prompts), expect, atol=1e-5)
