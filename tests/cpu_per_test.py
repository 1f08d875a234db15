"""pytest plugin: each test's wall seconds and the machine's CPU seconds over it (setup,
call and teardown; /proc/stat's busy time, so every process the test starts or wakes
counts: Ray's, servers', subprocesses'), one JSON line per test. The machine must be
otherwise idle for the figures to be the test's. Where the suite's CPU goes
(docs/benchmarks.md, "The test suite's CPU"):

    PYTHONPATH=tests CPU_PER_TEST_OUT=cpu.jsonl .venv/bin/python -m pytest -p cpu_per_test tests/
"""

from __future__ import annotations

import json
import os
import time

import pytest

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """Seconds of CPU the machine has spent busy since boot (all cores)."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, stat.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / _TICKS_PER_S


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall, start = machine_busy_s(), time.monotonic(), time.time()
    yield
    row = {"test": item.nodeid, "start": start, "wall": time.monotonic() - wall}
    row["cpu"] = machine_busy_s() - cpu
    with open(os.environ.get("CPU_PER_TEST_OUT", "cpu_per_test.jsonl"), "a") as out:
        out.write(json.dumps(row) + "\n")
