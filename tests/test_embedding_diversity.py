"""Diversity from a scorer's image embedding (issue 57): the measure's known answers, the
scorers' ``embed``, the reward server's ``embed`` request over real HTTP, and an
evaluation through the driver that records ``diversity_embed``. Each test here fails on
3bb9114, where no scorer had ``embed``, the server no ``embed`` field and the driver no
such measure."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch
from g2rpo.common.errors import UsageError
from g2rpo.common.health.embedding_diversity import embedding_diversity
from g2rpo.common.prompts.shapes import all_combinations, render_batch
from g2rpo.common.wire.messages import EvalSamples
from g2rpo.reward_server.client import RewardClient, RewardRequestError
from g2rpo.reward_server.embeddings import embedding_scorer
from g2rpo.reward_server.schemas import SAFETENSORS_TYPE
from g2rpo.reward_server.scorers.base import can_embed
from g2rpo.reward_server.scorers.clip_score import ClipScore
from g2rpo.reward_server.scorers.registry import EMBEDDING_SCORERS, make_scorer
from g2rpo.reward_server.wire import encode_safetensors
from servers import RewardServerProcess

SPECS = all_combinations()[:12]
IMAGES = render_batch(SPECS, seed=3)
PROMPTS = [s.prompt for s in SPECS]


def _clip(world) -> ClipScore:
    return ClipScore(world / "shapes_clip", name="shapes_clip")


# --- the measure ---------------------------------------------------------------------


def test_known_answers_identical_orthogonal_and_one_sample():
    """Catches a wrong formula (a self-pair counted, the wrong normaliser, a distance of
    another kind): identical samples are 0 apart, orthogonal ones 1, a prompt's value is
    repeated for each of its samples, and one sample a prompt has no pair (NaN)."""
    same = np.tile(np.array([[0.6, 0.8, 0.0]]), (3, 1))
    np.testing.assert_allclose(embedding_diversity(same, 3), 0.0, atol=1e-12)
    eye = np.eye(4) * 5.0  # any scale: rows are normalised
    np.testing.assert_allclose(embedding_diversity(eye, 4), 1.0)
    # two prompts: identical pair, then opposite pair (cos -1: distance 2)
    two = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    np.testing.assert_allclose(embedding_diversity(two, 2), [0.0, 0.0, 2.0, 2.0], atol=1e-12)
    # three samples: pairs (a,b) orthogonal, (a,c) identical, (b,c) orthogonal -> 2/3
    three = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    np.testing.assert_allclose(embedding_diversity(three, 3), 2 / 3)
    assert np.isnan(embedding_diversity(eye, 1)).all() and embedding_diversity(eye, 1).shape == (4,)
    assert np.isnan(embedding_diversity(eye[:3], 2)).all()  # not a whole number of prompts


def test_an_evaluation_takes_a_held_out_scorers_embedding_first():
    """Catches the choice taking a trained scorer's features (the ones the policy is paid
    to please) when a held-out scorer with an image tower is served."""
    assert embedding_scorer(["shapes_oracle", "shapes_clip", "pickscore"], ["shapes_clip"]) == (
        "pickscore"
    )
    assert embedding_scorer(["shapes_clip", "jpeg_compressibility"], ["shapes_clip"]) == (
        "shapes_clip"
    )
    assert embedding_scorer(["shapes_oracle", "jpeg_compressibility"], ["shapes_oracle"]) is None


# --- the scorers -----------------------------------------------------------------------


def test_clip_embed_is_the_feature_its_score_reads_and_the_registry_says_who_embeds(world):
    """Catches an ``embed`` of other features than the score's (its cosine with the
    prompt's unit text embedding is the score) and a name list (the worker's choice)
    that disagrees with the scorer objects."""
    clip = _clip(world)
    emb = clip.embed(IMAGES)
    assert emb.dtype == np.float32 and emb.shape == (len(IMAGES), clip.model.config.projection_dim)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    with torch.no_grad():
        text = torch.stack([clip._prompt_embedding(p) for p in PROMPTS]).numpy()
    np.testing.assert_allclose((emb * text).sum(1), clip.score(IMAGES, PROMPTS), atol=1e-6)
    np.testing.assert_allclose(clip.embed(IMAGES[:3]), emb[:3], atol=1e-6)  # padded small call
    assert clip.embed(IMAGES[:0]).shape == (0, emb.shape[1])
    assert can_embed(clip) and "shapes_clip" in EMBEDDING_SCORERS
    for name in ("shapes_oracle", "jpeg_compressibility"):
        assert not can_embed(make_scorer(name)) and name not in EMBEDDING_SCORERS


def test_image_reward_embed_is_blips_contrastive_image_feature(tmp_path):
    """Catches ImageReward's ``embed`` reading another token or skipping ``vision_proj``:
    against BLIP's own image feature, normalize(vision_proj(ViT(x)[:, 0])), from the raw
    checkpoint's tensors."""
    from g2rpo.reward_server.convert import convert_reward
    from reward_checkpoints import (
        IR_VISION,
        blip_vit,
        image_reward_state_dict,
        openclip_preprocess,
        tiny_bert_tokenizer,
    )

    tokenizer = tiny_bert_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tok")
    sd = image_reward_state_dict(vocab=len(tokenizer) + 2, seed=2)
    torch.save(sd, tmp_path / "ImageReward.pt")
    out = tmp_path / "image_reward"
    convert_reward("image_reward", tmp_path / "ImageReward.pt", out, tokenizer=tmp_path / "tok")
    scorer = make_scorer("image_reward", path=out)
    images = np.random.default_rng(1).integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    with torch.no_grad():
        cls = blip_vit(sd, openclip_preprocess(images, IR_VISION["image"]))[:, 0]
        want = torch.nn.functional.normalize(
            cls @ sd["blip.vision_proj.weight"].T + sd["blip.vision_proj.bias"], dim=-1
        )
    got = scorer.embed(images)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    assert can_embed(scorer) and "image_reward" in EMBEDDING_SCORERS


def test_saved_images_are_embedded_in_process_from_scorer_specs(world):
    """Catches the offline path (the hacking study's, on evals/it_N.images.npz) giving
    other features than the scorer's, or answering a spec list without an embedder
    with nothing instead of saying what to give."""
    from g2rpo.evaluation.metrics import embed_saved_images

    got = embed_saved_images([f"shapes_clip={world / 'shapes_clip'}", "shapes_oracle"], IMAGES)
    assert list(got) == ["shapes_clip"]
    np.testing.assert_allclose(got["shapes_clip"], _clip(world).embed(IMAGES), atol=1e-6)
    with pytest.raises(UsageError, match="none has an image embedding"):
        embed_saved_images(["shapes_oracle"], IMAGES)


def test_g2rpo_eval_summary_has_diversity_embed():
    """Catches ``g2rpo eval``'s health summary leaving the embedding measure out (or
    pairing it wrongly against the base): two prompts of two samples, the model's
    first prompt a repeated image (0) and its second orthogonal (1); the base's both 1."""
    from g2rpo.evaluation.eval_outputs import split_summary
    from g2rpo.evaluation.evaluate import SplitSamples

    images = IMAGES[:4]
    values = {"s": np.arange(4.0)}
    model_emb = np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], np.float16)
    base_emb = np.array([[1, 0, 0], [0, 1, 0], [0, 1, 0], [0, 0, 1]], np.float16)
    model = SplitSamples("held_out", ["a", "b"], 2, images, values, model_emb, "shapes_clip")
    base = SplitSamples("held_out", ["a", "b"], 2, images, values, base_emb, "shapes_clip")
    health = split_summary(model, base)["health"]
    assert health["embedding_scorer"] == "shapes_clip"
    assert health["metrics"]["diversity_embed"]["mean"] == pytest.approx(0.5)
    assert health["vs_base"]["diversity_embed"]["mean"] == pytest.approx(-0.5)


# --- over real HTTP --------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedding_server(world):
    """``g2rpo reward-server`` serving the world's shapes_clip and jpeg (no tower); the
    in-process embeddings computed while it starts."""
    server = RewardServerProcess(
        "--scorers",
        f"shapes_clip={world / 'shapes_clip'},jpeg_compressibility",
        quiet=True,
        ready=False,
    )
    try:
        clip = _clip(world)
        expected = {"embed": clip.embed(IMAGES), "score": clip.score(IMAGES, PROMPTS)}
        server.wait_ready()
        yield server, expected
    finally:
        server.stop()


def _post(url: str, request: dict) -> httpx.Response:
    files = {"images": ("b.safetensors", encode_safetensors(IMAGES), SAFETENSORS_TYPE)}
    return httpx.post(
        f"{url}/v1/score", data={"request": json.dumps(request)}, files=files, timeout=60
    )


def test_the_server_returns_the_requested_embeddings(embedding_server):
    """Catches embeddings lost, reordered or mangled on the wire, or dropped when the client
    cuts a batch into several requests (3 here, merged back in order): the answer's
    embeddings are [N, D], unit rows, the in-process ``embed`` to float16 precision."""
    server, expected = embedding_server
    # ~3 images a request: 12 images of 32² go as 4 requests merged into one answer
    one_image = 32 * 32 * 3 + 200
    client = RewardClient([server.url], request_bytes=16 * 2**10 + 3 * one_image)
    with client:
        response = client.score(
            IMAGES, PROMPTS, ["shapes_clip", "jpeg_compressibility"], embed=["shapes_clip"]
        )
        assert len(client.last_requests) > 1
    from g2rpo.reward_server.embeddings import response_embeddings

    got = response_embeddings(response, "shapes_clip")
    assert got.dtype == np.float16 and got.shape == expected["embed"].shape
    assert list(response.embeddings) == ["shapes_clip"]
    np.testing.assert_allclose(np.linalg.norm(got.astype(np.float32), axis=1), 1.0, atol=2e-3)
    np.testing.assert_allclose(got.astype(np.float32), expected["embed"], atol=1e-3, rtol=0)
    np.testing.assert_allclose(response.scores["shapes_clip"], expected["score"], atol=1e-6)


def test_a_bad_embed_request_is_refused_naming_the_field(embedding_server):
    """Catches a scorer without an image tower (jpeg) or one not among the request's
    scorers being asked for embeddings and answered 500 or silently: 422, ``field``
    naming ``embed``."""
    server, _ = embedding_server
    both = ["shapes_clip", "jpeg_compressibility"]
    blind = _post(
        server.url, {"scorers": both, "prompts": PROMPTS, "embed": ["jpeg_compressibility"]}
    )
    assert blind.status_code == 422 and blind.json()["field"] == "embed", blind.text
    assert "jpeg_compressibility" in blind.json()["detail"]
    assert "shapes_clip" in blind.json()["detail"]  # what to ask instead
    outside = _post(
        server.url,
        {"scorers": ["jpeg_compressibility"], "prompts": PROMPTS, "embed": ["shapes_clip"]},
    )
    assert outside.status_code == 422 and outside.json()["field"] == "request.embed"
    with (
        RewardClient([server.url]) as client,
        pytest.raises(RewardRequestError, match="embed"),
    ):
        client.score(IMAGES, PROMPTS, ["jpeg_compressibility"], embed=["jpeg_compressibility"])


def test_a_score_only_answer_has_no_embeddings_key(embedding_server):
    """Catches a score-only answer gaining a key (a client of before embeddings forbids
    extra keys) or scores that differ when embeddings are asked too."""
    server, expected = embedding_server
    plain = _post(server.url, {"scorers": ["shapes_clip"], "prompts": PROMPTS})
    assert plain.status_code == 200, plain.text
    body = plain.json()
    assert "embeddings" not in body
    assert set(body) == {"request_id", "scores", "versions", "cached", "timings_ms", "replica"}
    np.testing.assert_allclose(body["scores"]["shapes_clip"], expected["score"], atol=1e-6)
    asked = _post(
        server.url, {"scorers": ["shapes_clip"], "prompts": PROMPTS, "embed": ["shapes_clip"]}
    )
    assert asked.json()["scores"] == body["scores"]
    assert asked.json()["embeddings"]["shapes_clip"]["dtype"] == "float16"


# --- through the driver --------------------------------------------------------------


def test_evaluation_parts_merge_their_embeddings_in_order():
    """Catches the driver's merge of an evaluation spread over workers dropping or
    reordering the embeddings, or keeping a partial column when a part has none."""
    from g2rpo.orchestration.evaluations import merge

    def part(rows, emb):
        return EvalSamples(
            IMAGES[:0], {"s": rows}, 1.0, 3, embeddings=emb, embedding_scorer="shapes_clip"
        )

    a, b = np.eye(3, dtype=np.float16)[:2], np.eye(3, dtype=np.float16)[2:]
    merged = merge([part([1.0, 2.0], a), part([3.0], b)])
    np.testing.assert_array_equal(merged.embeddings, np.eye(3, dtype=np.float16))
    assert merged.embedding_scorer == "shapes_clip" and merged.scores["s"] == [1.0, 2.0, 3.0]
    assert merge([part([1.0, 2.0], a), part([3.0], None)]).embeddings is None


def test_an_evaluation_through_the_driver_records_diversity_embed(
    warm, world, scorer_url, tmp_path
):
    """Catches the evaluation (spread over the 2 workers: a prompt's samples may sit in
    two slices) not asking for, merging or measuring the embeddings: every evaluation's
    row has eval/health/diversity_embed (the second its paired change), evals/it_N.json
    its per-sample values and the scorer they came from, equal to the measure of the
    saved images' in-process embeddings."""
    from g2rpo.run_directory.files import read_metrics
    from small_run import small_train

    keep = ["train.eval.keep_images=true"]  # every image saved: measured here again
    run_dir = small_train(world, tmp_path, "embed", 2, keep, reward_url=scorer_url, warm=warm)
    rows = [r for r in read_metrics(run_dir) if "eval/health/diversity" in r]
    assert len(rows) >= 2
    assert all(np.isfinite(r["eval/health/diversity_embed"]) for r in rows)
    assert "eval/health/diversity_embed/delta" in rows[1]
    clip = _clip(world)
    records = sorted((run_dir / "evals").glob("it_*[0-9].json"))
    assert len(records) >= 2  # every iteration's, and the forced one at the end
    for path in records:
        record = json.loads(path.read_text())
        assert record["embedding_scorer"] == "shapes_clip"  # the only one served
        got = np.array(record["health"]["diversity_embed"])
        images = np.load(path.with_suffix(".images.npz"))["images"]
        want = embedding_diversity(clip.embed(images), record["per_prompt"])
        np.testing.assert_allclose(got, want, atol=2e-3)  # float16 on the wire
        assert got.shape == (len(images),) and got.max() > 0
