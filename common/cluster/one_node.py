"""A run config as the one-node checks (``g2rpo doctor``, ``bench precision``) run it:
every core in one process on this node's device, without Ray."""

from __future__ import annotations

from pathlib import Path

from ..config.loading import load_config


def device_overrides(
    config: str | Path | None, overrides: list[str], device: str | None
) -> list[str]:
    """``overrides`` plus ``model.device=<device>``; on CUDA also a GPU for each
    model-running actor kind that asks Ray for none. Training refuses such a config (Ray
    would not reserve the GPU its model runs on), but here nothing is placed by Ray: the
    count only says how the memory plan shares a GPU, so a fraction is kept as it is."""
    if device is None:
        return list(overrides)
    extra = [f"model.device={device}"]
    if device.startswith("cuda"):
        kinds = load_config(config, overrides).train.actor_kinds()
        extra += [f"{path}.num_gpus=1" for path, kind in kinds.items() if kind.num_gpus <= 0]
    return [*overrides, *extra]
