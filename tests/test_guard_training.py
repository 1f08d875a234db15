"""train.guard on real runs: a run paid for JPEG incompressibility (DDPO's hack the other
way round: the policy learns blotches and speckle a JPEG cannot compress) is stopped
before its last evaluation; a run on shapes_clip, where no hack is seen, is left alone."""

import json

import pytest
from g2rpo.orchestration.driver import read_metrics
from servers import RewardServerProcess
from small_run import small_train

pytestmark = pytest.mark.slow

# both scorers asked for at every evaluation: the one trained on, and one held out
GUARDED = [
    "train.workers.count=1",
    "train.guard.action=stop",
    "train.reward.scorers=[jpeg_compressibility, shapes_clip]",
]


@pytest.fixture(scope="module")
def jpeg_and_clip_url(world):
    server = RewardServerProcess(
        "--scorers", f"jpeg_compressibility,shapes_clip={world / 'shapes_clip'}", quiet=True
    )
    yield server.url
    server.stop()


def test_the_guard_stops_a_hacking_run_and_leaves_a_clean_one_alone(
    warm, world, jpeg_and_clip_url, tmp_path, capfd
):
    hacking = small_train(
        world,
        tmp_path,
        "hacking",
        6,
        [
            *GUARDED,
            "rewards=[{name: jpeg_compressibility, weight: -1}]",  # paid for a larger JPEG
            "optim.lr=1e-3",
        ],
        reward_url=jpeg_and_clip_url,
        warm=warm,
    )
    rows = read_metrics(hacking)
    done = json.loads((hacking / "finished.json").read_text())
    # evaluated at every iteration (tests/small_run.py); the default rules (the distance
    # from the base's samples, then the texture too) are crossed at two evaluations in a
    # row well before iteration 5
    assert done["reason"] == "guard" and done["iterations"] < 5, rows[-1]
    assert rows[-1].get("guard/stop") == 1 and rows[-1]["guard/streak"] == 2
    assert rows[-1]["eval/health/high_freq/delta_lo"] > 0  # blotches: more texture
    assert rows[-1]["eval/shapes_clip/delta_hi"] < 0  # what it was not paid for fell
    assert (hacking / "final").is_dir()  # exported and evaluated as a finished run
    assert (hacking / "evals" / f"it_{done['iterations']:05d}.json").is_file()
    assert "train.guard stopped the run after iteration" in capfd.readouterr().err

    clean = small_train(
        world,
        tmp_path,
        "clean",
        4,
        [*GUARDED, "rewards=[{name: shapes_clip}]"],
        reward_url=jpeg_and_clip_url,
        warm=warm,
    )
    rows = read_metrics(clean)
    assert json.loads((clean / "finished.json").read_text())["reason"] == "iterations"
    assert [r["guard/streak"] for r in rows] == [0, 0, 0, 0]
    assert not any("guard/stop" in r for r in rows)
    # the held-out score it does not train on: jpeg compressibility, unchanged
    assert rows[-1]["eval/drift/diverging"] == 0.0


def test_an_alert_trains_on_and_keeps_the_healthy_checkpoint_to_export(
    warm, world, jpeg_and_clip_url, tmp_path, capfd
):
    """`train.guard.action: alert` on the JPEG hack: the alarm is raised and logged once,
    the run trains to its end, pruning (keep 2) leaves the checkpoint of the last healthy
    evaluation, and `g2rpo export RUN --checkpoint healthy` writes those weights."""
    import subprocess

    import torch
    from servers import G2RPO

    run = small_train(
        world,
        tmp_path,
        "alerting",
        6,
        [
            *GUARDED,
            "train.guard.action=alert",
            "train.checkpoints.keep=2",
            "rewards=[{name: jpeg_compressibility, weight: -1}]",
            "optim.lr=1e-3",
        ],
        reward_url=jpeg_and_clip_url,
        warm=warm,
    )
    rows = read_metrics(run)
    assert json.loads((run / "finished.json").read_text())["reason"] == "iterations"
    assert [r["iteration"] for r in rows] == list(range(6))  # it trained on
    alerts = [r["iteration"] for r in rows if r.get("guard/alert")]
    assert len(alerts) == 1 and all(r.get("guard/tripped") for r in rows[alerts[0] :])
    assert capfd.readouterr().err.count("train.guard raised its alarm") == 1
    healthy = json.loads((run / "healthy.json").read_text())
    assert healthy["iteration"] < alerts[0] and healthy["tripped"]["iteration"] == alerts[0]
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    if healthy["checkpoint"] is None:  # only the base was healthy: its weights are exported
        assert healthy["iteration"] == 0 and kept == ["it_00005.pt", "it_00006.pt"]
    else:  # the newest two + the healthy one, which pruning left
        assert healthy["checkpoint"] in kept and len(kept) == 3

    out = tmp_path / "healthy-export"
    cmd = [G2RPO, "export", str(run), "--checkpoint", "healthy", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    from g2rpo.common.config.loading import load_config
    from g2rpo.common.families.registry import family_class

    transformer = family_class(load_config(run / "config.yaml")).transformer_class()
    exported = transformer.from_pretrained(out / "transformer").state_dict()
    if healthy["checkpoint"] is None:
        expected = transformer.from_pretrained(world / "pipeline" / "transformer").state_dict()
    else:
        ckpt = run / "checkpoints" / healthy["checkpoint"]
        expected = torch.load(ckpt, weights_only=False)["transformer"]
    for name, value in exported.items():
        assert torch.equal(value, expected[name]), name
    # a later checkpoint is not the same weights: the export is the healthy one's
    later = torch.load(run / "checkpoints" / "it_00006.pt", weights_only=False)["transformer"]
    assert any(not torch.equal(v, later[n]) for n, v in exported.items())
