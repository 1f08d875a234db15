"""Addresses where this process can listen or meet others: free ports, and inside a
Ray actor its node and the resources Ray gave it."""

from __future__ import annotations

import os
import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_address() -> str:
    """Called inside an actor: ``node_ip:port`` with a port free on its node, where
    a process group (the learner group, the weight broadcast) meets."""
    import ray  # here, not at the top: the doctor and bench precision run without Ray

    ip = ray.util.get_node_ip_address()
    return f"{ip}:{free_port(ip)}"


# the variables naming the interface gloo and NCCL open their sockets on
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def interface_of(ip: str) -> str | None:
    """The name of this machine's network interface that holds ``ip`` (None: none)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addresses):
            return name
    return None


def pin_socket_interfaces(node_ip: str, environ=None) -> dict[str, str]:
    """Point gloo and NCCL at the interface that holds ``node_ip`` (the address other
    nodes reach this one at), unless the environment already names one
    (``train.env_vars``); returns the variables it set.

    Why: gloo opens its sockets on the address the hostname resolves to, and where
    that is 127.0.0.1 or 127.0.1.1 (Debian's /etc/hosts) a peer on another node is
    told to connect to its own loopback, and a join hangs for the collective timeout
    (about 18 minutes for FLUX.1-dev). NCCL's ``=name`` is an exact match (a bare name
    is a prefix: ``eth0`` would also match ``eth01``)."""
    environ = os.environ if environ is None else environ
    name = interface_of(node_ip)
    if name is None:
        return {}
    chosen = {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": f"={name}"}
    set_now = {k: v for k, v in chosen.items() if not environ.get(k)}
    environ.update(set_now)
    return set_now


def pin_to_ray_node() -> dict[str, str]:
    """Inside a Ray actor: ``pin_socket_interfaces`` for Ray's node IP (which Ray's
    own nodes reach each other at). Outside Ray (the doctor, a one-process bench)
    nothing: a group there has one node."""
    import ray

    if not ray.is_initialized():
        return {}
    return pin_socket_interfaces(ray.util.get_node_ip_address())
