"""Timeouts that scale with the model a run loads, when the config leaves them unset.

What takes long at FLUX scale is reading weights: learner rank 0 reads and upcasts the
transformer while the other ranks wait for it in the group's first collective, a
restarted rollout worker reloads its whole pipeline, and each rank writes its shards of
the weights and optimizer state at a checkpoint. Each of those moves a known number of
bytes, so each timeout is a floor plus those bytes at a pessimistic read rate: storage
shared by a cluster's nodes while many processes read the same files at once (the
first load of a run), not a local NVMe's."""

from __future__ import annotations

from pathlib import Path

from ..config.run import G2RPOConfig
from ..paths import resolve_path

FLOOR_S = 120.0  # process start, imports, group rendezvous: what a tiny model needs
SHARED_READ_BYTES_PER_S = 50e6  # one reader's share of a busy network filesystem
UNKNOWN_S = 1800.0  # the weights cannot be measured from here (another node's path)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def weights_on_disk(pipeline: str | Path | None, components: tuple[str, ...]) -> int | None:
    """Bytes of the weight files of ``components`` (subfolders) of a local pipeline
    directory; None when the directory is not readable from this process."""
    if pipeline is None:
        return None
    root = resolve_path(str(pipeline))
    if not root.is_dir():
        return None
    total = 0
    for component in components:
        for path in (root / component).glob("*"):
            if path.suffix in WEIGHT_SUFFIXES and path.is_file():
                total += path.stat().st_size
    return total


def _scaled(nbytes: int | None, reads: float) -> float:
    if nbytes is None:
        return UNKNOWN_S
    return FLOOR_S + reads * nbytes / SHARED_READ_BYTES_PER_S


def collective_timeout_s(cfg: G2RPOConfig) -> float:
    """``train.collective_timeout_s``, or scaled: the longest a learner-group
    collective legitimately waits is rank 0 reading the transformer (then upcasting it)
    and each rank writing about two copies of its float32 share at a checkpoint, so
    twice the transformer's bytes on disk (FLUX.1-dev: 23.8 GB → about 18 min)."""
    if cfg.train.collective_timeout_s is not None:
        return cfg.train.collective_timeout_s
    return _scaled(weights_on_disk(cfg.model.pretrained, ("transformer",)), reads=2.0)


def worker_start_timeout_s(cfg: G2RPOConfig) -> float:
    """``train.workers.start_timeout_s``, or scaled: a restarted rollout worker (or
    evaluator) reads its whole pipeline once (FLUX.1-dev: about 33 GB → about 13 min)."""
    if cfg.train.workers.start_timeout_s is not None:
        return cfg.train.workers.start_timeout_s
    components = ("transformer", "vae", "text_encoder", "text_encoder_2")
    return _scaled(weights_on_disk(cfg.model.pretrained, components), reads=1.0)
