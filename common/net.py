"""Addresses where this process can listen or meet others: free ports, and inside a
Ray actor its node and the resources Ray gave it."""

from __future__ import annotations

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
