"""The Redis control plane: replicas register (URL, scorers, load) under a key with a
TTL, refresh it by heartbeat and delete it on shutdown; clients list live replicas."""

from __future__ import annotations

import json
import time

from pydantic import BaseModel

PREFIX = "g2rpo:replicas:"


class ReplicaInfo(BaseModel):
    replica: str
    url: str
    scorers: list[str]
    load: int = 0
    pid: int = 0
    started: float = 0.0
    heartbeat: float = 0.0


def register(client, info: ReplicaInfo, ttl_s: float) -> None:
    info = info.model_copy(update={"heartbeat": time.time()})
    client.set(PREFIX + info.replica, info.model_dump_json(), px=int(ttl_s * 1000))


def deregister(client, replica: str) -> None:
    client.delete(PREFIX + replica)


def live_replicas(client, scorer: str | None = None) -> list[ReplicaInfo]:
    keys = sorted(client.scan_iter(match=PREFIX + "*", count=100))
    if not keys:
        return []
    out = []
    for raw in client.mget(keys):
        if raw is None:  # expired between SCAN and MGET
            continue
        info = ReplicaInfo.model_validate(json.loads(raw))
        if scorer is None or scorer in info.scorers:
            out.append(info)
    return out
