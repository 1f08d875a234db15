"""Training with a learner group of 2 (FSDP2 over gloo) on a real local Ray: exact
resume, resume on another number of learners, and a worker frozen past the rollout
timeout, another killed and the reward server killed in the run that is then resumed,
against a calm run of the same group. (A
rollout worker killed under broadcast weights in a group: tests/test_recovery.py.)"""

import json
import os
import shutil
import signal

import pytest
import torch
from g2rpo.orchestration.driver import read_metrics, train
from small_run import small_train, when_first_row

# a training run, a Ray cluster or a service: `pytest -m 'not slow'` leaves it out
pytestmark = pytest.mark.slow

TWO = ["train.learner.count=2"]


def _run(world, out, name, iterations, extra=(), **kw):
    return small_train(world, out, name, iterations, [*TWO, *extra], **kw)


def _strip(rows):
    """What a run computed: no timings, and not how the weights travelled."""
    drop = ("weights_via", "weight_groups_formed", "weight_broadcast_failures")
    return [
        {k: v for k, v in r.items() if not k.startswith("time/") and k not in drop} for r in rows
    ]


@pytest.fixture(scope="module")
def calm(calm_group_run):
    """The uninterrupted 3-iteration run of a 2-learner group (conftest)."""
    return _strip(read_metrics(calm_group_run))


def test_frozen_and_killed_workers_and_reward_server_then_resumed_exactly_and_on_one_learner(
    calm, warm, world, scorer_url, tmp_path
):
    """In iteration 1 of a 2-learner run stopped after 2 iterations (--max-iterations),
    scored by a job-started reward replica: rollout worker 1 is frozen (SIGSTOP),
    worker 0 (which also evaluates: no evaluator actor) and then the replica's reward
    server are SIGKILLed. The frozen worker holds the iteration only until
    train.workers.rollout_timeout_s: it is killed, and Ray restarts it; Ray restarts
    worker 0 too, and the replica its server. Killed before its evaluation, during it
    or during its rollout share, worker 0 redoes each with the published weights (an
    evaluation sampled with other weights would change the eval/ numbers), worker 1 its
    share once: the group's numbers are those of the calm run (nothing trained twice or
    lost). The run then resumes exactly on the group, and on one learner from its
    sharded checkpoint. (The one frozen-worker test: the rollout timeout is the
    driver's, whatever the learner count. It took in test_training.py's rollout actor
    and reward server killed, on one learner, whose resume the one-learner resume here
    covers.)"""
    import time

    def freeze_and_kill(record):
        frozen, killed = record["rollout_workers"][1], record["rollout_workers"][0]
        os.kill(frozen, signal.SIGSTOP)
        os.kill(killed, signal.SIGKILL)
        time.sleep(1.0)  # worker 1's share is being scored, or waits to be
        os.kill(record["reward_servers"][0], signal.SIGKILL)
        return {"frozen": frozen, "killed": killed, "server": record["reward_servers"][0]}

    thread, faults = when_first_row(tmp_path / "part", freeze_and_kill)
    timeout = ["train.workers.rollout_timeout_s=10"]
    part = _run(world, tmp_path, "part", 3, timeout, max_iterations=2, warm=warm)
    thread.join(timeout=5)
    assert "server" in faults
    record = json.loads((part / "actors.json").read_text())
    assert record["rollout_workers"][1] != faults["frozen"]  # killed and restarted by Ray
    assert record["rollout_workers"][0] != faults["killed"]  # restarted by Ray
    assert record["reward_servers"][0] != faults["server"]  # the replica restarted its server
    rows = _strip(read_metrics(part))
    assert [r["iteration"] for r in rows] == [0, 1] and not (part / "final").exists()
    # every prompt's trajectory present once, and the same numbers as the calm run
    assert [r["transitions"] for r in rows] == [r["transitions"] for r in calm[:2]]
    assert rows == calm[:2]
    ckpts = sorted(p.name for p in (part / "checkpoints").iterdir())
    assert ckpts == ["it_00001.dcp", "it_00002.dcp"]  # sharded: each rank wrote its part
    assert len(json.loads((part / "actors.json").read_text())["learners"]) == 2
    alone = tmp_path / "alone"
    shutil.copytree(part, alone)

    # g2rpo eval reads a sharded checkpoint: the weights one learner resumes from
    from g2rpo.common.config.loading import load_config
    from g2rpo.evaluation.policy import load_policy, resolve_policy
    from g2rpo.learner.trainer import LearnerCore

    source = resolve_policy(part, checkpoint="2")
    assert source.weights.name == "it_00002.dcp"
    evaluated = load_policy(source).transformer.state_dict()
    resumed = LearnerCore(load_config(part / "config.yaml", ["train.learner.count=1"]))
    assert resumed.load(str(source.weights)) == 2
    learned = resumed.trained_state()
    assert sorted(evaluated) == sorted(learned)
    assert all(torch.equal(evaluated[k], learned[k]) for k in learned)

    # resumed on the session's reward server: no replica of their own to start (its
    # scores are the replica's, whatever the company: reward_server/scorers/clip_score.py)
    served = ["train.reward.scorers=[]", f"train.reward.urls=[{scorer_url}]"]
    train(None, served, resume=part, progress=False, warm=warm)
    assert _strip(read_metrics(part)) == calm  # bitwise, as one learner resumes

    train(None, [*served, "train.learner.count=1"], resume=alone, progress=False, warm=warm)
    rows = _strip(read_metrics(alone))
    assert rows[:2] == calm[:2]
    # iteration 2 samples with the weights the group checkpointed, loaded exactly
    # into one learner: the same rollouts and rewards; its update sums in another
    # order (one rank), so the learner's numbers agree to rounding
    for key in ("reward/shapes_clip", "anchor_reward/shapes_clip", "eval/shapes_clip"):
        assert rows[2][key] == calm[2][key], key
    assert rows[2]["loss"] == pytest.approx(calm[2]["loss"], abs=1e-7)
    assert rows[2]["ratio_max"] == pytest.approx(calm[2]["ratio_max"], rel=1e-5)
    assert (alone / "checkpoints" / "it_00003.pt").is_file()
    assert (alone / "final" / "transformer").is_dir()
