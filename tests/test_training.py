"""Training on a real local Ray with a real reward-server process, on the committed world."""

import pytest
import yaml
from g2rpo.common.wire.weights import WeightMismatch
from g2rpo.learner.trainer import LearnerCore, StaleTrajectories
from g2rpo.orchestration.driver import read_metrics, train
from g2rpo.rollout_worker.worker import RolloutWorkerCore
from small_run import PROMPTS_PER_WORKER, SMALL_RUN, small_train

# Not marked slow: the main job's path (a driver on local Ray, its workers, learner and
# reward server) is in .ci/run's gate, beside the rehearsal's multi-node run (~75 CPU-s).

SMALL = SMALL_RUN


def _run(world, out, name, iterations, extra=(), **kw):
    return small_train(world, out, name, iterations, extra, **kw)


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_three_iterations_with_two_workers(calm_run):
    run = calm_run
    rows = read_metrics(run)
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert [r["version"] for r in rows] == [0, 1, 2] and rows[1]["weight_versions"] == [1]
    for r in rows:
        assert r["transitions"] == 2 * PROMPTS_PER_WORKER * 2 * 4  # workers · prompts · K · G
        assert r["optimizer_steps"] == 2 and 0 <= r["clip_fraction"] <= 1
        assert r["branch_steps"] == [0, 1]  # every one of sampling.sde_steps (the default)
        for key in ("rollout_s", "reward_s", "learn_s", "weight_push_s", "iteration_s"):
            assert r[f"time/{key}"] >= 0
        assert "reward/shapes_clip/g1" in r and "eval/shapes_clip" in r
    assert (run / "checkpoints" / "it_00003.pt").is_file()
    assert list((run / "samples").glob("*.png"))
    curves = run / "curves.png"  # the run's curves, drawn at its last checkpoint
    assert curves.stat().st_size > 10_000
    assert curves.stat().st_mtime >= (run / "checkpoints" / "it_00003.pt").stat().st_mtime
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["train"]["workers"]["count"] == 2


def test_lora_run_publishes_adapters_and_resumes_exactly(warm, world, scorer_url, tmp_path):
    import json

    lora = ["model.lora.rank=4", "model.lora.alpha=8"]
    full = _run(world, tmp_path, "lora-full", 2, lora, warm=warm, reward_url=scorer_url)
    full = _strip(read_metrics(full))
    part = _run(
        world, tmp_path, "lora-part", 2, lora, max_iterations=1, warm=warm, reward_url=scorer_url
    )
    assert not (part / "final").exists()  # not finished: nothing exported yet
    train(None, [], resume=part, progress=False, warm=warm)
    assert _strip(read_metrics(part)) == full
    base_bytes = (world / "pipeline" / "transformer").glob("*.safetensors")
    base_bytes = sum(p.stat().st_size for p in base_bytes)
    for row in full:
        assert 0 < row["weights_bytes"] < 0.2 * base_bytes  # adapters only on the wire
        assert row["ratio_min"] > 0.9 and row["weight_versions"] == [row["version"]]
    ckpt = part / "checkpoints" / "it_00002.pt"
    assert ckpt.stat().st_size < 0.5 * base_bytes
    assert (part / "final" / "pytorch_lora_weights.safetensors").is_file()
    placement = json.loads((part / "actors.json").read_text())["placement"]
    assert len(placement["rollout_workers"]) == 2  # replicas: test_placement.py, test_recovery.py
    # each worker records the SDPA kernels its rollout uses (model.rollout_attention_backend)
    assert all(w["attention_backend"] == "auto" for w in placement["rollout_workers"])


def test_stale_trajectories_and_bad_weights_are_refused(world):
    from g2rpo.common.config.loading import load_config

    cfg = load_config(
        None, [*SMALL, f"model.pretrained={world / 'pipeline'}", "train.workers.count=1"]
    )
    learner = LearnerCore(cfg)
    worker = RolloutWorkerCore(cfg, 0)
    version, state, checksum = learner.weights()
    bad = {k: v.clone() for k, v in state.items()}
    next(iter(bad.values())).add_(1.0)
    with pytest.raises(WeightMismatch, match="checksum"):
        worker.load_weights(version, bad, checksum)
    assert worker.load_weights(version, state, checksum).holds(version, checksum)
    learner.version = 3  # the learner moved on; the worker is still on v0
    from g2rpo.common.wire.trajectories import Trajectories

    stale = Trajectories(
        worker=0,
        iteration=0,
        version=0,
        prompts=[],
        plan=None,
        transitions=None,
        cond={},
        leaf_rewards={},
        nfe=0,
        model_calls=0,
    )
    with pytest.raises(StaleTrajectories, match="v0"):
        learner.update([stale])


def test_nfe_budget_stops_the_run_and_a_finished_run_stays_finished(
    warm, world, scorer_url, tmp_path, capfd
):
    import json

    from g2rpo.common.algorithms.rollout_plan import algorithm_nfe
    from g2rpo.rollout_worker.plan import g2rpo_plan

    # per iteration: each of the 2 workers' rollout tree + one learner forward per
    # (prompt, SDE step)
    per_iteration = 2 * (
        algorithm_nfe(g2rpo_plan(PROMPTS_PER_WORKER, 6, 4, [0, 1], [1, 2])) + PROMPTS_PER_WORKER * 2
    )
    budget = int(2.5 * per_iteration)  # two iterations fit, a third would pass it
    over = ["train.eval.every=10", f"run.nfe_budget={budget}"]
    run = _run(world, tmp_path, "budget", 50, over, reward_url=scorer_url, warm=warm)
    rows = read_metrics(run)
    assert [r["nfe_train_total"] for r in rows] == [per_iteration, 2 * per_iteration]
    assert all(r["nfe_train"] == per_iteration for r in rows)
    done = json.loads((run / "finished.json").read_text())
    assert done == {"reason": "nfe_budget", "iterations": 2, "nfe_train_total": 2 * per_iteration}
    assert (run / "final" / "transformer").is_dir()
    # evaluated at iteration 0 and after the last update (2); not also at the last
    # iteration (1), one update short of that (train.eval.every is 10)
    assert sorted(p.stem for p in (run / "evals").glob("*.json")) == ["it_00000", "it_00002"]
    final_eval = json.loads((run / "evals" / "it_00002.json").read_text())
    assert final_eval["nfe_train_total"] == 2 * per_iteration and final_eval["version"] == 2
    assert "eval/shapes_clip" in rows[0] and not any(k.startswith("eval/") for k in rows[1])
    capfd.readouterr()
    train(None, [], resume=run, progress=False, warm=warm)  # nothing left to do: no actor started
    assert "is finished: nothing left to do" in capfd.readouterr().err
    assert len(read_metrics(run)) == 2 and (run / "finished.json").is_file()


# last: the overlapped run is a 2-learner group, as the next file's runs are (the warm
# pool keeps a group of each size while there is room; runs of one size side by side
# also reuse its rollout workers' loaded config)
def test_staleness_one_rolls_out_the_next_iteration_beside_the_update(overlapped_run, calm_run):
    """train.weights.staleness=1: iteration i+1 is sampled with v_i while the learner updates on
    iteration i, so from the second iteration on every batch is learned one version
    late (recorded as weight_lag); the run still trains, evaluates and finishes."""
    run = overlapped_run
    rows = read_metrics(run)
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert [r["weight_lag"] for r in rows] == [0, 1, 1]
    assert [r["version"] for r in rows] == [0, 0, 1]  # the weights that sampled each batch
    assert all(r["optimizer_steps"] == 2 and "eval/shapes_clip" in r for r in rows)
    assert (run / "finished.json").is_file() and (run / "final").is_dir()
    in_order = read_metrics(calm_run)
    assert [r["weight_lag"] for r in in_order] == [0, 0, 0]
    # the first iteration is the same computation either way
    assert _strip([rows[0]])[0]["reward/shapes_clip"] == in_order[0]["reward/shapes_clip"]
