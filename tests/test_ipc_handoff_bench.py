"""`g2rpo bench ipc-handoff` (bin/gpu-check runs it on a GPU with CUDA IPC handles): on
the CPU, two processes over shared memory, the receiver ends up holding the sender's
version and what crossed between them is handles and layouts, a few hundred bytes a
bucket. On 3bb9114 there was no such command."""

import json
import subprocess

from g2rpo.reward_server.process import g2rpo_executable


def test_bench_ipc_handoff_hands_a_version_over_with_only_handles_through_the_host():
    args = ["--gib", "0.02", "--tensor-mib", "2", "--bucket-mib", "8", "--repeats", "1"]
    proc = subprocess.run(
        [g2rpo_executable(), "bench", "ipc-handoff", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    assert r["checksums_agree"] is True and r["bytes_agree"] is True
    assert (r["device"], r["tensors"], r["buckets"]) == ("cpu", 10, 3)  # 4 tensors a bucket
    assert 0 < r["host_bytes"] < 300 * r["buckets"] + 100 * r["tensors"]
    assert r["seconds"] > 0 and r["seconds_per_gib"] > 0
