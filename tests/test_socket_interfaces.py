"""gloo across two hosts whose hostname resolves to loopback (issue 55, item 9).

Two network namespaces joined by a veth pair stand for two nodes; /etc/hosts on this
machine maps its hostname to 127.0.0.1 (Debian's 127.0.1.1 does the same), so gloo,
left to itself, tells the peer to connect to the peer's own loopback and the join
fails (or hangs for the collective timeout). With the interface chosen from the
node's IP (``common.cluster.net.pin_socket_interfaces``, what every learner rank and weight
group member does with Ray's node IP) the group forms and reduces."""

import itertools
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest
from g2rpo.common.cluster.net import interface_of, pin_socket_interfaces

# one rank of a 2-rank gloo group: RANK ADDRESS NODE_IP PIN(0/1)
JOIN = """
import sys
from datetime import timedelta
import torch, torch.distributed as dist
from g2rpo.common.cluster.net import pin_socket_interfaces
rank, address, node_ip, pin = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1"
if pin:
    print("set", pin_socket_interfaces(node_ip), flush=True)
dist.init_process_group("gloo", init_method=f"tcp://{address}", rank=rank, world_size=2,
                        timeout=timedelta(seconds=8))
x = torch.tensor([rank + 1.0])
dist.all_reduce(x)
print("sum", x.item(), flush=True)
"""


NETNS_EXEC = ("ip", "netns", "exec")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_hosts():
    """Two network namespaces, 10.231.0.1 and .2 on a veth pair; (run, ips, ifnames)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns) to make two hosts")
    tag = uuid.uuid4().hex[:6]
    ns, ifs, ips = (
        [f"g2t{tag}a", f"g2t{tag}b"],
        [f"g2{tag}a", f"g2{tag}b"],
        ["10.231.0.1", "10.231.0.2"],
    )
    try:
        for n in ns:
            _ip("netns", "add", n)
        _ip("link", "add", ifs[0], "type", "veth", "peer", "name", ifs[1])
        for n, i, a in zip(ns, ifs, ips, strict=True):
            _ip("link", "set", i, "netns", n)
            _ip("-n", n, "addr", "add", f"{a}/24", "dev", i)
            _ip("-n", n, "link", "set", i, "up")
            _ip("-n", n, "link", "set", "lo", "up")

        runs = itertools.count()

        def run(pin: bool) -> list[tuple[int, str]]:
            # a port of its own for each run: a killed run's store may hold the last
            address, pin = f"{ips[0]}:{29561 + next(runs)}", "1" if pin else "0"
            procs = [
                subprocess.Popen(
                    [*NETNS_EXEC, ns[r], sys.executable, "-c", JOIN, str(r), address, ips[r], pin],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for r in range(2)
            ]
            # a rank that failed leaves its peer waiting out gloo's connect timeout
            # (about 40 s): once one has failed, the other gets 3 s more
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                codes = [p.poll() for p in procs]
                if all(c is not None for c in codes) or any(c for c in codes):
                    deadline = min(deadline, time.monotonic() + 3)
                    if all(c is not None for c in codes):
                        break
                time.sleep(0.2)
            outs = []
            for p in procs:
                if p.poll() is None:
                    p.kill()
                out, _ = p.communicate()
                outs.append((p.returncode, out))
            return outs

        yield run, ips, ifs
    finally:
        for n in ns:  # deleting a namespace deletes its end of the veth pair, and so both
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=30, check=False)


def test_gloo_joins_across_hosts_only_on_the_node_ip_interface(two_hosts):
    run, _, ifs = two_hosts
    # as on 3bb9114: nothing names an interface, the hostname's (loopback) is taken
    left_alone = run(pin=False)
    assert not any("sum 3.0" in out for _, out in left_alone), left_alone
    pinned = run(pin=True)
    for rank, (code, out) in enumerate(pinned):
        assert code == 0 and "sum 3.0" in out, (rank, out[-2000:])
        assert f"'GLOO_SOCKET_IFNAME': '{ifs[rank]}'" in out
        assert f"'NCCL_SOCKET_IFNAME': '={ifs[rank]}'" in out


def test_interfaces_named_by_the_user_are_kept():
    env = {"GLOO_SOCKET_IFNAME": "ib0"}
    set_now = pin_socket_interfaces("127.0.0.1", env)
    assert set_now == {"NCCL_SOCKET_IFNAME": "=lo"}  # only what was not given
    assert env == {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "=lo"}
    assert interface_of("127.0.0.1") == "lo"
    assert pin_socket_interfaces("203.0.113.77", {}) == {}  # an address no interface holds
