"""Known-answer tests for the published reward checkpoints without downloads: tiny
random checkpoints in each ORIGINAL key layout (OpenCLIP as HPS-v2.1 and DFN5B ship
it, ImageReward's BLIP + MLP) are converted with ``g2rpo convert-reward``; every
original tensor must be used exactly once, the converted scorers must equal an
independent plain-torch forward of the original architecture (fp32, 1e-5), and a
wrong or truncated checkpoint is refused naming what is missing."""

import json

import numpy as np
import pytest
import torch
from g2rpo.reward_server.convert import CheckpointMismatch, convert_reward
from g2rpo.reward_server.random_models import byte_level_clip_tokenizer
from g2rpo.reward_server.scorers.registry import make_scorer
from reward_checkpoints import (
    CLIP_VISION,
    IR_VISION,
    bert_tokens,
    image_reward_reference,
    image_reward_state_dict,
    openclip_image_features,
    openclip_preprocess,
    openclip_state_dict,
    openclip_text_features,
    openclip_tokens,
    tiny_bert_tokenizer,
)

PROMPTS = [
    "a red circle on a blue background",
    "a green square",
    "a red circle on a blue background",
    # longer than the 77-token context: truncation keeps the end-of-text token last
    "a yellow star on a black background with a purple triangle " * 3,
]


def _images(n, h=32, w=32, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def _numel(tensors) -> int:
    return sum(t.numel() for t in tensors)


@pytest.fixture(scope="module")
def clip_tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip_tok")
    byte_level_clip_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def bert_tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert_tok")
    tiny_bert_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hps_checkpoint(tmp_path_factory):
    """HPS_v2.1_compressed.pt's container: {"state_dict": open_clip keys}."""
    sd = openclip_state_dict(seed=1)
    path = tmp_path_factory.mktemp("hps_orig") / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": sd}, path)
    return path, sd


@pytest.fixture(scope="module")
def hps_dir(hps_checkpoint, clip_tokenizer_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("hps") / "hpsv2"
    convert_reward("hpsv2", hps_checkpoint[0], out, tokenizer=clip_tokenizer_dir)
    return out


@pytest.mark.parametrize("kind, quick", [("hpsv2", False), ("dfn5b_clip", True)])
def test_openclip_conversion_uses_every_tensor_once_and_matches_the_original_forward(
    kind, quick, hps_checkpoint, clip_tokenizer_dir, tmp_path
):
    from g2rpo.reward_server.convert.openclip import PRESETS, openclip_to_clip

    path, sd = hps_checkpoint
    config, weights, leftover = openclip_to_clip(sd, PRESETS[kind])
    # every original tensor (but the causal-mask buffer) went into exactly one place
    assert leftover == []
    assert _numel(weights.values()) == _numel(v for k, v in sd.items() if k != "attn_mask")
    assert config.vision_config.num_attention_heads == 2 and config.text_config.hidden_act == (
        "quick_gelu" if quick else "gelu"
    )
    out = tmp_path / kind
    record = convert_reward(kind, path, out, tokenizer=clip_tokenizer_dir)
    assert record["left_over"] == [] and record["source_tensors"] == len(sd)
    assert (
        json.loads((out / "conversion.json").read_text())["source_sha256"]
        == record["source_sha256"]
    )
    name = "hpsv2" if kind == "hpsv2" else "clip_score"
    scorer = make_scorer(name, path=out)
    tok = byte_level_clip_tokenizer()
    for images in (_images(4), _images(4, 40, 48, seed=3)):  # square, and resized + cropped
        got = scorer.score(images, PROMPTS)
        with torch.no_grad():
            pixels = openclip_preprocess(images, CLIP_VISION["image"])
            img = openclip_image_features(sd, pixels, quick=quick)
            txt = openclip_text_features(sd, openclip_tokens(tok, PROMPTS), quick=quick)
            # HPS-v2.1 and the CLIP score: the cosine of the normalised features
            want = torch.nn.functional.cosine_similarity(img, txt, dim=-1)
        np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=0)
        assert np.ptp(got) > 1e-3  # the scores do depend on the inputs
    assert scorer.version.startswith(f"{kind}-")


def test_openclip_config_file_sets_heads_and_activation(
    hps_checkpoint, clip_tokenizer_dir, tmp_path
):
    path = hps_checkpoint[0]
    cfg = tmp_path / "open_clip_config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_cfg": {
                    "quick_gelu": True,
                    "vision_cfg": {"head_width": 40},
                    "text_cfg": {"width": 128, "heads": 4},
                },
                "preprocess_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
            }
        )
    )
    out = tmp_path / "oc"
    convert_reward("openclip", path, out, tokenizer=clip_tokenizer_dir, openclip_config=cfg)
    config = json.loads((out / "config.json").read_text())
    assert config["vision_config"]["num_attention_heads"] == 4
    assert config["text_config"]["num_attention_heads"] == 4
    assert config["text_config"]["hidden_act"] == "quick_gelu"
    pre = json.loads((out / "preprocessor_config.json").read_text())
    assert pre["image_mean"] == [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match="--openclip-config"):
        convert_reward("openclip", path, tmp_path / "x", tokenizer=clip_tokenizer_dir)


def test_wrong_or_truncated_checkpoints_are_refused_naming_the_keys(
    hps_checkpoint, clip_tokenizer_dir, bert_tokenizer_dir, tmp_path
):
    path, sd = hps_checkpoint
    broken = {k: v for k, v in sd.items() if "resblocks.1.attn" not in k and k != "ln_final.bias"}
    torch.save(broken, tmp_path / "missing.pt")
    with pytest.raises(
        CheckpointMismatch, match=r"missing 9 tensor\(s\): visual\.transformer\.resblocks\.1"
    ):
        convert_reward(
            "hpsv2", tmp_path / "missing.pt", tmp_path / "o1", tokenizer=clip_tokenizer_dir
        )
    reshaped = dict(sd, **{"visual.proj": torch.zeros(160, 7)})
    torch.save(reshaped, tmp_path / "shape.pt")
    with pytest.raises(CheckpointMismatch, match=r"wrong shape: text_projection"):
        convert_reward(
            "hpsv2", tmp_path / "shape.pt", tmp_path / "o2", tokenizer=clip_tokenizer_dir
        )
    data = path.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointMismatch, match="not a readable torch checkpoint"):
        convert_reward(
            "hpsv2", tmp_path / "truncated.pt", tmp_path / "o3", tokenizer=clip_tokenizer_dir
        )
    # an ImageReward checkpoint given as HPS, and the other way round
    torch.save(image_reward_state_dict(vocab=90), tmp_path / "ir.pt")
    with pytest.raises(CheckpointMismatch, match=r"missing tensor visual\.conv1\.weight"):
        convert_reward("hpsv2", tmp_path / "ir.pt", tmp_path / "o4", tokenizer=clip_tokenizer_dir)
    with pytest.raises(CheckpointMismatch, match=r"missing tensor blip\.visual_encoder"):
        convert_reward("image_reward", path, tmp_path / "o5", tokenizer=bert_tokenizer_dir)
    # a tokenizer whose vocabulary does not fit the checkpoint
    with pytest.raises(ValueError, match="has 514 rows"):
        convert_reward("hpsv2", path, tmp_path / "o6", tokenizer=bert_tokenizer_dir)
    assert not (tmp_path / "o1").exists()  # nothing half-written


def test_image_reward_conversion_matches_the_original_forward(bert_tokenizer_dir, tmp_path):
    from g2rpo.reward_server.convert.image_reward import image_reward_to_transformers

    vocab = len(tiny_bert_tokenizer()) + 2  # BLIP adds [DEC] and [ENC]
    sd = image_reward_state_dict(vocab=vocab, seed=2)
    _, weights, leftover = image_reward_to_transformers(sd)
    assert leftover == []
    assert _numel(weights.values()) == _numel(v for k, v in sd.items() if not k.endswith("_ids"))
    torch.save(sd, tmp_path / "ImageReward.pt")
    out = tmp_path / "image_reward"
    convert_reward("image_reward", tmp_path / "ImageReward.pt", out, tokenizer=bert_tokenizer_dir)
    scorer = make_scorer("image_reward", path=out)
    prompts = ["a red circle on a blue background", "a green square", "a star " * 30, "a cross"]
    tok = scorer.tokenizer
    for images in (_images(4, seed=5), _images(4, 48, 40, seed=6)):
        got = scorer.score(images, prompts)
        with torch.no_grad():
            ids, mask = bert_tokens(tok, prompts)
            want = image_reward_reference(
                sd, openclip_preprocess(images, IR_VISION["image"]), ids, mask
            )
        np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=0)
        assert np.ptp(got) > 1e-3
    # batching does not change a score; the raw .pt is pointed at the conversion
    small = make_scorer("image_reward", path=out)
    small.batch_size = 3
    np.testing.assert_allclose(
        small.score(_images(4, seed=5), prompts),
        scorer.score(_images(4, seed=5), prompts),
        atol=1e-6,
    )
    with pytest.raises(ValueError, match="convert-reward image_reward"):
        make_scorer("image_reward", path=tmp_path / "ImageReward.pt")


def test_bpe_file_tokenizer_is_open_clips_vocabulary(tmp_path):
    """open_clip's bpe_simple_vocab_16e6.txt.gz → 256·2 byte symbols + merges + sot/eot."""
    import gzip

    from g2rpo.reward_server.convert.tokenizers import clip_tokenizer_from_bpe

    merges = ["#version: 0.2", "r e", "re d</w>", "l e</w>", "c i", "ci r", "cir c", "circ le</w>"]
    path = tmp_path / "bpe.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(merges) + "\n")
    tok = clip_tokenizer_from_bpe(path)
    assert len(tok) == 512 + 7 + 2
    ids = tok("red circle")["input_ids"]
    assert ids == [519, 513, 518, 520]  # sot, "red</w>", "circle</w>", eot


def test_one_reward_server_process_serves_all_four_converted_scorers(
    hps_dir, hps_checkpoint, clip_tokenizer_dir, bert_tokenizer_dir, tmp_path
):
    """``g2rpo convert-reward`` as a process, then ``g2rpo reward-server --scorers
    hpsv2=DIR,image_reward=DIR,clip_score=DIR,pickscore=DIR`` over real HTTP."""
    import subprocess

    from g2rpo.reward_server.client import RewardClient
    from servers import G2RPO, RewardServerProcess

    dfn = tmp_path / "dfn5b"

    def convert(*args):
        cmd = [G2RPO, "convert-reward", *map(str, args), "--tokenizer", str(clip_tokenizer_dir)]
        return subprocess.run(cmd, capture_output=True, text=True)

    done = convert("dfn5b_clip", hps_checkpoint[0], dfn, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["kind"] == "dfn5b_clip"
    bad = convert("hpsv2", tmp_path / "none.pt", tmp_path / "x")
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    vocab = len(tiny_bert_tokenizer()) + 2
    torch.save(image_reward_state_dict(vocab=vocab, seed=4), tmp_path / "ImageReward.pt")
    ir = tmp_path / "image_reward"
    convert_reward("image_reward", tmp_path / "ImageReward.pt", ir, tokenizer=bert_tokenizer_dir)
    # PickScore ships in transformers' CLIP layout already: any CLIPModel dir serves
    dirs = {"hpsv2": hps_dir, "image_reward": ir, "clip_score": dfn, "pickscore": hps_dir}
    spec = ",".join(f"{name}={path}" for name, path in dirs.items())
    server = RewardServerProcess("--scorers", spec, "--max-batch", "4")
    try:
        with RewardClient([server.url]) as client:
            images = _images(6, seed=9)
            prompts = PROMPTS[:3] * 2
            got = client.score(images, prompts, list(dirs))
    finally:
        server.stop()
    for name, path in dirs.items():
        local = make_scorer(name, path=path)
        np.testing.assert_allclose(got.scores[name], local.score(images, prompts), atol=1e-5)
        assert got.versions[name] == local.version
    assert got.versions["hpsv2"] == got.versions["pickscore"]  # same weights, same version
    # PickScore is HPS's cosine times exp(logit_scale) = 1/0.07 here
    np.testing.assert_allclose(
        np.array(got.scores["pickscore"]), np.array(got.scores["hpsv2"]) / 0.07, rtol=1e-5
    )
