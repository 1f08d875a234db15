"""Host memory per node (issue 55): `g2rpo plan`'s host section gives each node's RAM
per phase, object store and /dev/shm from the model's sizes and what the code holds on
the host (planning/host_memory.py, host_nodes.py), and `g2rpo doctor` holds this
machine against it. Known answers for flux_hps_8gpu (one node of 8 colocated pairs, the
reward replicas inside two) and flux_hps (a learner node, two worker nodes, a reward node),
worked by hand below; none of this existed at 3bb9114."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from g2rpo.common.config.loading import load_config
from g2rpo.planning.host_nodes import host_plan

REPO = Path(__file__).resolve().parents[1]
GiB = 2**30
# FLUX.1-dev's transformer: P parameters; a bf16 version (and a worker's transformer) 2P
P = 11_901_408_320
V = 2 * P  # 23,802,816,640 B = 22.168 GiB
PROCESS = 3 * GiB  # each CUDA process's assumed baseline
RAY = 1 * GiB  # Ray's processes on a node (2 GiB on the head)
HPS = 2 * 986_000_000  # a reward replica's HPS-v2.1 (ViT-H) weights in bf16
# one worker's trajectory batch: per prompt 8 trained states (SDE steps 0-7) + 96
# transitions (8 steps x 12 branches), float32 latents of 45 x 45 tokens x 64 = 129,600;
# and per prompt its T5 rows (512 x 4096) + pooled CLIP (768) in bf16
LATENT = 129_600 * 4


def batch(prompts: int) -> int:
    return prompts * (8 + 96) * LATENT + prompts * (512 * 4096 + 768) * 2


def images(prompts: int) -> int:  # 1 anchor + 8 steps x 12 branches x 2 granularities
    return prompts * 193 * 3 * 720**2


def nodes_of(path: str, *sets: str) -> dict:
    return {n.name: n for n in host_plan(load_config(REPO / path, list(sets)))}


def gib(n: float) -> float:
    return round(n / GiB, 2)


def test_flux_hps_8gpu_one_node_phase_by_phase():
    nodes = nodes_of("configs/flux_hps_8gpu.yaml")
    # 8 pairs, the 2 reward replicas inside two of them (train.reward.in_pairs)
    assert list(nodes) == ["head", "node 1"]
    node = nodes["node 1"]
    assert node.kinds() == {"learner rank": 8, "rollout worker": 8, "reward replica": 2}
    assert node.gpus == 8
    # the version goes GPU to GPU (CUDA IPC): the store holds one only for a restarted
    # worker or the evaluator, and the 8 workers' batches (2 prompts each):
    # 22.168 + 8 x 0.108 = 23.03 GiB
    store = V + 8 * batch(2)
    assert node.store_bytes == store
    base = 18 * PROCESS + RAY  # 8 workers, 8 ranks, 2 replicas: 55 GiB
    # train.offload auto resolves to none/none at 80 GiB (planning/offload_choice.py):
    # nothing of either side waits on the host
    want = {
        # 8 workers each read their bf16 transformer on the host (their largest
        # component), rank 0 reads the transformer in float32, the 2 replicas their scorers
        # (HPS-v2.1 and the held-out DFN5B CLIP, each a ViT-H);
        # nothing published yet: 177.34 + 44.34 + 7.35 + 55 = 284.03
        "load": 8 * V + 4 * P + 4 * HPS + base,
        # each worker holds its images and batch: 5.34 + 23.03 + 55 = 83.37
        "rollout": 8 * (batch(2) + images(2)) + store + base,
        "publish": store + base,  # 78.03
        "learn": store + base,
        # DCP stages a tensor at a time: a FLUX block's float32 shard on rank 0 (+0.16)
        "checkpoint": store + base + 4 * 339_831_296 // 8,
        "export": 4 * P + store + base,  # rank 0 gathers float32 weights: 122.37
    }
    for phase, n in want.items():
        assert node.phase_bytes(phase) == n, phase
    assert (node.peak_phase, gib(node.peak)) == ("load", 284.03)
    assert gib(node.shm_bytes) == gib(store + GiB)  # + NCCL's segments: 24.03
    head = nodes["head"]  # the driver (1 GiB), Ray's head (2), an evaluation's images
    evaluation = 400 * 2 * 3 * 720**2  # 400 prompts x 2 samples (issue 57)
    assert head.phase_bytes("load") == 3 * GiB
    assert head.phase_bytes("rollout") == 3 * GiB + 2 * evaluation  # held + in the store


def test_flux_hps_8gpu_offloading_everything_as_before_the_plan_chose():
    node = nodes_of(
        "configs/flux_hps_8gpu.yaml", "train.offload.learner=all", "train.offload.worker=all"
    )["node 1"]
    state = 4 * P // 8 + 8 * P // 8  # a rank's float32 shard + AdamW's moments: 16.63 GiB
    store, base = V + 8 * batch(2), 18 * PROCESS + RAY
    # the 8 ranks' states wait on the host while the workers roll out: 133.01 + 83.37
    assert node.phase_bytes("rollout") == 8 * state + 8 * (batch(2) + images(2)) + store + base
    # at the publish the workers' transformers wait too, and every rank has stepped aside
    # (by CUDA IPC no rank holds a gathered version on the host): 177.34 + 133.01 + 78.03
    assert node.phase_bytes("publish") == 8 * V + 8 * state + store + base
    assert node.phase_bytes("learn") == 8 * V + store + base  # 255.37
    assert (node.peak_phase, gib(node.peak)) == ("publish", 388.39)


def test_flux_hps_learner_worker_and_reward_nodes():
    nodes = nodes_of("configs/flux_hps.yaml")
    kinds = {name: n.kinds() for name, n in nodes.items()}
    assert kinds == {
        "head": {"driver": 1},
        "node 1": {"learner rank": 8},  # STRICT_PACK: the group on one node
        "node 2": {"rollout worker": 8},
        "node 3": {"rollout worker": 8},
        "node 4": {"reward replica": 2},  # 2 x 0.5 GPU: nothing left on the other nodes
    }
    learners, workers, reward = nodes["node 1"], nodes["node 2"], nodes["node 4"]
    # learner node: rank 0's versions + every worker's batch (1 prompt each), fetched there
    store = 2 * V + 16 * batch(1)  # 45.20 GiB
    assert learners.store_bytes == store
    base = 8 * PROCESS + RAY
    assert learners.phase_bytes("load") == 4 * P + base  # 44.34 + 25 = 69.34
    assert learners.phase_bytes("publish") == V + store + base  # 92.37
    assert learners.phase_bytes("export") == 4 * P + store + base  # 114.54, its peak
    assert learners.peak_phase == "export"
    # a worker node: 8 transformers pass through the host at once as the workers load
    assert workers.phase_bytes("load") == 8 * V + base  # 202.34
    assert workers.store_bytes == V + 8 * batch(1)  # the version its workers read: 22.60
    # publish: zero-copy, nothing private beyond the baselines (before: 8 private copies)
    assert workers.phase_bytes("publish") == workers.store_bytes + base  # 47.60
    assert reward.phase_bytes("load") == 4 * HPS + 2 * PROCESS + RAY  # 2 ViT-H's each: 14.35
    assert reward.store_bytes == 0 and reward.shm_bytes == GiB


def test_plan_prints_and_carries_the_host_section(capsys):
    from g2rpo.cli import main

    assert main(["plan", str(REPO / "configs/flux_hps_8gpu.yaml"), "--json"]) == 0
    host = json.loads(capsys.readouterr().out)["host"]
    assert host["phases"] == ["load", "rollout", "publish", "learn", "checkpoint", "export"]
    node = host["nodes"][1]
    assert (node["peak_gib"], node["peak_phase"], node["object_store_gib"]) == (
        284.03,
        "load",
        23.03,
    )
    assert main(["plan", str(REPO / "configs/flux_hps.yaml")]) == 0
    out = capsys.readouterr().out
    assert "host memory per node" in out and "node 4: 2 reward replicas (1 GPUs)" in out
    # a learner group no node of 4 GPUs holds (STRICT_PACK): said, not raised
    assert main(["plan", str(REPO / "configs/flux_hps.yaml"), "--gpus-per-node", "4"]) == 0
    assert "host memory: train.learner: 8 bundles" in capsys.readouterr().out


def test_pack_spreads_the_colocated_pairs_of_flux_hps_16gpu_over_two_nodes():
    """16 pairs, 8 a node; reward replica j in pair 8j (train.reward.in_pairs): one on each
    node, in a pair's bundle."""
    nodes = nodes_of("configs/flux_hps_16gpu.yaml")
    for node in ("node 1", "node 2"):
        assert nodes[node].kinds() == {
            "learner rank": 8,
            "rollout worker": 8,
            "reward replica": 1,
        }
    # the versions go GPU to GPU (CUDA IPC); each node's store is sized for the one a
    # worker Ray restarted there loads (rank 0's put, node 2's copy of it)
    assert nodes["node 1"].store_bytes == nodes["node 2"].store_bytes == V + 16 * batch(1)


# ------------------------------------------------------------------- g2rpo doctor

WITHOUT_RAY = "import sys; sys.modules['ray'] = None; from g2rpo.cli import main; sys.exit(main())"


def doctor(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY, "doctor", *args, "--host-only", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_doctor_fails_a_node_short_of_memtotal_and_passes_one_that_fits():
    """This machine (24 GiB on the CI's) against flux_hps_8gpu's one node (416 GiB):
    the host phase fails naming MemTotal, by how much and the setting; the tiny world
    fits it; an object store given too small is named with Ray's setting."""
    from g2rpo.planning.doctor_host import mem_total

    need = host_plan(load_config(REPO / "configs/flux_hps_8gpu.yaml"))[1].peak
    assert mem_total() < need, "a machine this big cannot fail the check this test makes"
    proc = doctor("configs/flux_hps_8gpu.yaml")
    assert proc.returncode == 1, proc.stderr[-2000:]
    (phase,) = json.loads(proc.stdout)["phases"]
    assert phase["phase"] == "host memory" and phase["ok"] is False
    short = (need - mem_total()) / GiB
    assert f"MemTotal {mem_total() / GiB:.1f} GiB is short" in phase["error"]
    assert f"by {short:.1f} GiB" in phase["error"] and "memory limit" in phase["error"]
    assert phase["details"]["need_gib"] == 284.03
    fits = doctor("configs/tiny.yaml")
    assert fits.returncode == 0, fits.stdout[-2000:] + fits.stderr[-2000:]
    (phase,) = json.loads(fits.stdout)["phases"]
    assert phase["ok"] and phase["details"]["MemTotal_gib"] > phase["details"]["need_gib"]
    small = doctor("configs/tiny.yaml", "--object-store-memory", "1MiB")
    assert small.returncode == 1
    assert "--object-store-memory=" in json.loads(small.stdout)["phases"][0]["error"]


def test_the_object_store_of_the_ray_this_process_joined_is_read(ray_local):
    """The tests' local Ray has a 256 MiB store: read for this node, and a node that
    needs more is told to start Ray with a bigger one."""
    from g2rpo.planning.doctor_host import (
        HostShort,
        check_host,
        running_object_store,
        this_node,
    )

    assert running_object_store() == 256 * 2**20
    have = this_node()
    assert have.object_store == 256 * 2**20 and have.object_store_from == "the running Ray"
    cfg = load_config(REPO / "configs/tiny.yaml")
    need = host_plan(cfg)[1].store_bytes
    with pytest.raises(HostShort, match="rayStartParams object-store-memory") as caught:
        check_host(cfg, 8, None, type(have)(have.mem_total, have.dev_shm, need - 1, "told"))
    assert "MemTotal" not in str(caught.value)  # the tiny world fits this machine's RAM
