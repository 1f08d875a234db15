"""CPU seconds spent by each kind of process on this machine while a command runs: every
process's utime + stime read from /proc every 2 s, less what it had used when first seen,
grouped by what it is (a Ray actor by its class, Ray's daemons, the g2rpo command).
Behind docs/rehearsals.md, "Where a rehearsal's time goes":

    .venv/bin/python docs/rehearsals/cpu_by_process.py -- \\
        bin/g2rpo rehearse configs/mixgrpo_flux.yaml --nodes 2 --out /tmp/rh

A process that lives less than 2 s between two reads is not counted."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
KINDS = [  # (pattern in the command line, kind), the first that matches
    (r"^(ray::\w+)", None),  # an actor, or a worker not yet an actor (ray::IDLE)
    (r"default_worker\.py", "Ray worker starting"),
    (r"raylet", "raylet"),
    (r"gcs_server", "GCS"),
    (r"log_monitor", "log monitor"),
    (r"agent", "dashboard / runtime-env agent"),
    (r"ray start", "ray start"),
    (r"g2rpo", "g2rpo command"),
]


def kind_of(cmdline: str) -> str:
    for pattern, kind in KINDS:
        if m := re.search(pattern, cmdline):
            return kind or m.group(1)
    return "other"


def read_all() -> dict[tuple[str, str], tuple[str, float]]:
    """(pid, start time) → (command line, CPU seconds so far) of every process."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline") as f:
                cmdline = f.read().replace("\0", " ")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        out[(pid, fields[19])] = (cmdline, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def main(command: list[str]) -> int:
    first = {key: cpu for key, (_, cpu) in read_all().items()}  # used before the command
    last: dict[tuple[str, str], tuple[str, float]] = {}
    t0 = time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        for key, (cmdline, cpu) in read_all().items():
            # a proctitle changes as a Ray worker becomes an actor: keep the newest
            last[key] = (cmdline or last.get(key, ("", 0.0))[0], cpu)
        time.sleep(2.0)
    wall = time.monotonic() - t0
    by_kind: collections.Counter[str] = collections.Counter()
    for key, (cmdline, cpu) in last.items():
        by_kind[kind_of(cmdline)] += cpu - first.get(key, 0.0)
    for kind, seconds in by_kind.most_common():
        print(f"{seconds:8.1f} CPU-s  {kind}")
    total = sum(by_kind.values())
    print(f"{total:8.1f} CPU-s in {wall:.0f} s: {total / wall / os.cpu_count():.0%} of the cores")
    return proc.returncode


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "--" or len(args) < 2:
        sys.exit("usage: cpu_by_process.py -- COMMAND [ARGS...]")
    sys.exit(main(args[1:]))
