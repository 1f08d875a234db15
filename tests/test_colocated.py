"""The colocated layout (train.placement colocated) on a real local Ray that declares
GPUs it does not have (tests/servers.py): rollout worker i and learner rank i in one
placement bundle of one GPU, kept there when Ray restarts the worker and when the
learner group is formed again, and computing what the disaggregated run computes."""

import json
import os
import signal

import pytest
from g2rpo.common.config.loading import load_config
from g2rpo.orchestration.driver import read_metrics
from g2rpo.orchestration.placement import learner_bundles
from small_run import small_train, when_first_row, when_rows

# a training run, a Ray cluster or a service: `pytest -m 'not slow'` leaves it out
pytestmark = pytest.mark.slow

COLOCATED = [
    "train.learner.count=2",
    "train.placement=colocated",
    "train.workers.num_gpus=0.5",
    "train.learner.num_gpus=0.5",
]


def _strip(rows):
    """What a run computed: no timings, not how weights travelled, no restarts."""
    drop = ("weights_via", "weight_groups_formed", "weight_broadcast_failures")
    drop += ("learner_restarts", "weight_handoff_fallbacks", "weight_handoff_host_bytes")
    return [
        {k: v for k, v in r.items() if not k.startswith("time/") and k not in drop} for r in rows
    ]


def _pairs(record):
    """[(learner rank i's GPU ids, rollout worker i's)] from an actors.json record."""
    placement = record["placement"]
    return [
        (rank["gpu_ids"], worker["gpu_ids"])
        for rank, worker in zip(placement["learners"], placement["rollout_workers"], strict=True)
    ]


def _assert_paired(pairs):
    assert all(len(rank) == 1 and rank == worker for rank, worker in pairs), pairs
    ranks = [rank[0] for rank, _ in pairs]
    assert len(set(ranks)) == len(ranks), pairs  # two ranks of one group never share


def test_bundles_hold_a_rank_and_its_worker_on_one_gpu():
    cfg = load_config(None, [*COLOCATED, "train.workers.count=2", "train.workers.num_cpus=2"])
    assert learner_bundles(cfg) == [{"CPU": 3.0, "GPU": 1.0}] * 2
    on_cpu = load_config(None, ["train.placement=colocated"])  # no GPU asked: none reserved
    assert learner_bundles(on_cpu) == [{"CPU": 2.0}]
    apart = load_config(None, ["train.learner.count=2", "train.learner.num_gpus=0.5"])
    assert learner_bundles(apart) == [{"CPU": 1.0, "GPU": 1.0}] * 2  # whole GPUs per rank


@pytest.mark.parametrize(
    ("over", "named"),
    [
        (["train.learner.count=2"], "train.workers.count 1 and train.learner.count 2"),
        (["train.weights.staleness=1"], "train.weights.staleness must be 0"),
        (["train.weights.transport=collective"], "use train.weights.transport object_store"),
        (
            ["train.workers.num_gpus=1", "train.learner.num_gpus=0.5"],
            "train.workers.num_gpus 1 + train.learner.num_gpus 0.5 exceed the one GPU",
        ),
    ],
)
def test_a_colocated_layout_that_cannot_take_turns_is_refused_naming_the_fields(over, named):
    from g2rpo.common.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train\.placement colocated") as err:
        load_config(None, ["train.placement=colocated", *over])
    assert named in str(err.value)


def test_colocated_run_keeps_each_pair_on_its_gpu_through_restarts_and_equals_the_group_run(
    calm_group_run, world, scorer_url, tmp_path
):
    """A 3-iteration colocated run of 2 pairs: rollout worker 1 is SIGKILLed early in
    iteration 1 (Ray restarts it in its bundle) and learner rank 1 after iteration 1's
    row (the group is formed again from the last checkpoint in the same bundles). Each
    rank shares its GPU with the worker of its index, before and after, the ranks'
    GPUs are distinct, and every row equals the disaggregated 2-learner run's."""
    run_dir = tmp_path / "colocated"

    def kill_worker(record):
        pid = record["rollout_workers"][1]
        os.kill(pid, signal.SIGKILL)
        return {"pid": pid, "pairs": _pairs(record)}

    def kill_rank(record):
        pid = record["learners"][1]
        os.kill(pid, signal.SIGKILL)
        return {"pid": pid, "pairs": _pairs(record)}

    worker_thread, worker = when_first_row(run_dir, kill_worker)
    rank_thread, rank = when_rows(run_dir, 2, kill_rank)
    small_train(world, tmp_path, "colocated", 3, COLOCATED, reward_url=scorer_url)
    worker_thread.join(timeout=5)
    rank_thread.join(timeout=5)
    assert "pid" in worker and "pid" in rank
    _assert_paired(worker["pairs"])
    after = json.loads((run_dir / "actors.json").read_text())
    assert worker["pid"] not in after["rollout_workers"]  # Ray restarted it
    assert rank["pid"] not in after["learners"]  # a new group
    assert _pairs(after) == worker["pairs"] == rank["pairs"]  # in the same bundles
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert max(r.get("learner_restarts", 0) for r in rows) == 1
    moves = {
        f"time/{side}_{way}_s" for side in ("worker", "learner") for way in ("offload", "onload")
    }
    assert all(moves <= r.keys() for r in rows)  # each iteration's (none on a CPU: 0 s)
    # each version handed to the workers inside the device (here: shared memory), as
    # handles and layouts: none of its bytes through Ray (issue 56; 3bb9114: object store)
    assert {r["weights_via"] for r in rows} == {"ipc"}
    assert all(0 < r["weight_handoff_host_bytes"] < r["weights_bytes"] / 100 for r in rows)
    assert _strip(rows) == _strip(read_metrics(calm_group_run))
    assert (run_dir / "finished.json").is_file()
