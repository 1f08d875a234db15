"""`g2rpo bench handoff` (bin/gpu-check runs it with a full-size FLUX.1-dev version on a
GPU): on the committed world on the CPU, the worker process ends up holding exactly the
version the learner process gathered, having read it from the one shared-memory copy.
The memory figure itself is judged at size by tests/test_weights_zero_copy.py."""

import json
import subprocess

from g2rpo.reward_server.process import g2rpo_executable


def test_bench_handoff_hands_the_version_to_a_worker_process(tmp_path):
    args = ["--set", "train.workers.count=1", "--store-dir", str(tmp_path), "--json"]
    proc = subprocess.run(
        [g2rpo_executable(), "bench", "handoff", "configs/tiny.yaml", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    worker = result["worker"]
    assert worker["holds_the_version"] is True and worker["weights_on"] == "cpu"
    assert result["version_gib"] > 0 and result["tensors"] > 100
    assert worker["store_pages_mapped_gib"] > 0  # it read the file's pages, not a copy sent to it
    assert set(result["learner"]["host_gib"]) == {"start", "built", "gathered", "put"} | {
        "dropped its copy"
    }
    assert list(tmp_path.iterdir()) == []  # the store's copy is removed after
