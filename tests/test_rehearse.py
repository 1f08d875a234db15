"""`g2rpo rehearse` as a user runs it, and the multi-node cluster it runs on: worker nodes
in mount namespaces of their own, whose run directory the driver does not see unless it
is shared (orchestration/local_nodes.py, orchestration/shared_dir.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
from servers import G2RPO

# a Ray cluster: `pytest -m 'not slow'` leaves it out
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20


def test_a_node_that_does_not_share_the_run_directory_stops_the_run_before_any_model_loads(
    tmp_path,
):
    """Two worker nodes on this machine, each in its own mount namespace: on one the run
    directory is the shared one, on the other a directory of its own (what a cluster
    without a shared filesystem is). Probes pinned to each node: the shared node's is
    seen, the private one's is not, and the error names run.output_dir and the actors
    of that node only."""
    import ray
    from g2rpo.common.errors import RunFailed
    from g2rpo.orchestration.local_nodes import LocalCluster
    from g2rpo.orchestration.shared_dir import probe_nodes
    from servers import session_ray_aside

    with session_ray_aside():
        run_dir = tmp_path / "runs" / "r"
        run_dir.mkdir(parents=True)
        cluster = LocalCluster(tmp_path / "cluster")
        try:
            nodes = [
                dict(name=name, num_cpus=1, num_gpus=0, resources={name: 1})
                | dict(object_store_bytes=2**28, private=private)
                for name, private in (("shares", []), ("alone", [tmp_path / "runs"]))
            ]
            cluster.start(2**28, nodes)
            ray.init(address=cluster.address, log_to_driver=False)
            cluster.wait_for(3)
            node = {
                name: n["NodeID"]
                for n in ray.nodes()
                for name in ("shares", "alone")
                if name in n["Resources"]
            }
            by_node = {node["shares"]: ["learner rank 0"], node["alone"]: ["rollout worker 1"]}
            with pytest.raises(RunFailed, match=r"^run\.output_dir: ") as err:
                probe_nodes(run_dir, by_node, timeout_s=60)
            assert "rollout worker 1" in str(err.value) and "learner rank 0" not in str(err.value)
            # the private node's probe landed in its own directory, at the path the driver uses
            (alone,) = [n for n in cluster.nodes if n.name == "alone"]
            assert list((alone.private[str(tmp_path / "runs")] / "r" / ".probes").iterdir())
            probe_nodes(run_dir, {node["shares"]: ["learner rank 0"]}, timeout_s=60)
        finally:
            ray.shutdown()
            cluster.stop()


# `ray` for the head; for a worker node, fails (as a raylet that never registers) while
# the count file holds fewer than FAILS lines, then runs `ray`
FLAKY_RAY = """#!/bin/sh
case "$*" in *--address=*)
  if [ "$(wc -l < {count})" -lt {fails} ]; then
    echo x >> {count}; echo "Failed to get node info (injected)"; exit 1
  fi;;
esac
exec {ray} "$@"
"""


def _flaky_ray(tmp_path: Path, fails: int) -> str:
    from g2rpo.orchestration.local_nodes import ray_executable

    count = tmp_path / f"failed_starts_{fails}"
    count.write_text("")
    script = tmp_path / f"flaky_ray_{fails}"
    script.write_text(FLAKY_RAY.format(count=count, fails=fails, ray=ray_executable()))
    script.chmod(0o755)
    return str(script)


def test_a_worker_node_that_does_not_start_starts_the_cluster_again(tmp_path, monkeypatch):
    """CI of 8d18b8d: a worker's `ray start` waited 5 minutes on the GCS and gave up, and
    the rehearsal failed in its cluster phase. The cluster stops (no process of the failed
    attempt left), keeps that attempt's logs, says why, and starts again; a worker that
    never starts fails with every attempt's reason and the head's state."""
    import ray
    from g2rpo.common.errors import RunFailed
    from g2rpo.orchestration import local_nodes
    from servers import session_ray_aside

    node = dict(name="node-1", num_cpus=1, num_gpus=0, resources={"n1": 1})
    node.update(object_store_bytes=2**28, private=[])
    said = []
    with session_ray_aside():
        once = _flaky_ray(tmp_path, 1)
        monkeypatch.setattr(local_nodes, "ray_executable", lambda: once)
        cluster = local_nodes.LocalCluster(tmp_path / "once")
        try:
            cluster.start(2**28, [node], say=said.append)
            head = cluster.nodes[0]
            ray.init(address=cluster.address, log_to_driver=False)
            cluster.wait_for(2, timeout_s=120)
            assert [n.name for n in cluster.nodes] == ["head", "node-1"]
        finally:
            ray.shutdown()
            cluster.stop()
        assert len(said) == 1 and "ray start (node-1) did not start" in said[0], said
        assert "(injected)" in said[0] and "starting it again (2 of 2)" in said[0], said
        assert "the head's GCS is running" in said[0], said
        logs = tmp_path / "once" / "logs"
        assert "(injected)" in (logs / "node-1.attempt1.log").read_text()
        assert "Ray runtime started" in (logs / "node-1.log").read_text()
        assert not local_nodes.processes_naming(head.temp_dir)

        monkeypatch.undo()
        never = _flaky_ray(tmp_path, 9)
        monkeypatch.setattr(local_nodes, "ray_executable", lambda: never)
        cluster = local_nodes.LocalCluster(tmp_path / "never")
        with pytest.raises(RunFailed) as err:
            cluster.start(2**28, [node], say=said.append)
        assert str(err.value).count("(injected)") == 2, err.value
        assert "attempt 1: ray start (node-1)" in str(err.value), err.value
        assert "attempt 2: ray start (node-1)" in str(err.value), err.value
        assert cluster.nodes == []  # stopped: nothing left to stop


def test_flux_hps_rehearses_on_two_nodes_at_its_true_sizes(tmp_path):
    """The Done-when command: `g2rpo rehearse configs/flux_hps.yaml --nodes 2`, as a
    process. It passes; its report holds the recipe's sizes (720² images sent in
    requests of at most train.reward.request_mib, every leaf of every worker scored), the
    faults it injected and survived, every file in the shared run directory and none in
    the nodes' own, and the run finished: final/, its evaluation, both sessions' rows."""
    out = tmp_path / "rehearsal"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    cmd = [G2RPO, "rehearse", "configs/flux_hps.yaml", "--nodes", "2", "--out", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
    assert "PASSED" in res.stdout
    report = json.loads((out / "rehearsal.json").read_text())
    assert report["passed"] and len(report["nodes"]) == 2

    leaves, side = 193, 720  # flux_hps: 1 prompt per worker, G=12, K=8, {1,2}; 720² images
    sent = report["bytes"]
    assert sent["reward_request_bytes"] <= 32 * MiB
    per_worker = math.ceil(leaves * side * side * 3 / (32 * MiB))
    assert sent["reward_requests_per_iteration"] >= 2 * per_worker  # 2 workers (the rule)
    # 8 SDE steps x 12 branches of next-latents, 2025 tokens x 64 channels in float32
    assert sent["trajectory_batch_bytes"] >= 8 * 12 * 2025 * 64 * 4

    assert set(report["faults"]) == {"rollout worker 0", "learner rank 1"}
    # the learner group's placement group (STRICT_PACK) holds its ranks on one node, the
    # ranks formed again after the kill too (actors.json is the second session's, at its end)
    learners = [a for a in report["memory"] if a["actor"].startswith("learners")]
    assert len(learners) == 2 and len({a["node"] for a in learners}) == 1
    files = report["files"]
    assert files["shared run directory"]["files"] > 0
    assert all(files[n["name"]]["files"] == 0 for n in report["nodes"])

    run = out / "runs" / "g2rpo-flux-hps"
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1]
    assert all(r["time/reward_s"] > 0 for r in rows)
    evals = sorted(p.name for p in (run / "evals").glob("it_*.json"))
    # iteration 0 (train.eval.every 25), and the trained weights after the resumed session
    assert evals == ["it_00000.json", "it_00002.json"]
    scored = json.loads((run / "evals" / "it_00002.json").read_text())["scores"]
    assert len(scored["hpsv2"]) == 800  # the recipe's held-out evaluation: 400 prompts x 2
    assert (run / "final" / "transformer" / "config.json").is_file()
    assert (run / "finished.json").is_file()

    # what catches reward hacking, at each evaluation (issue 57): every health measure of
    # every sample (2 a prompt: diversity; the held-out clip_score's embedding: its
    # diversity), the drift of the held-out clip_score against the trained hpsv2, and
    # train.guard's reading (action alert), the final evaluation's included
    from g2rpo.common.health.image_health import AGAINST_BASE, PER_IMAGE

    measures = sorted({*PER_IMAGE, *AGAINST_BASE, "diversity_embed"})
    first, final = report["evaluations"]
    assert [first["iteration"], final["iteration"]] == [0, 2]
    assert first["samples"] == final["samples"] == 800  # 400 prompts x 2
    assert first["health"] == final["health"] == measures
    assert set(final["drift"]) == {"eval/drift/clip_score", "eval/drift/diverging"}
    assert first["guard"]["guard/missing"] == final["guard"]["guard/missing"] == 0
    assert final["guard"]["guard/crossed"] >= 0 and "guard/streak" in final["guard"]
    assert f"guard/rule/{'drift/diverging above 0.5'}" in final["guard"]
    (failure,) = (run / "learner_failures.jsonl").read_text().splitlines()
    assert json.loads(failure)["rank"] == 1
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "it_00001.dcp",
        "it_00002.dcp",
    ]
