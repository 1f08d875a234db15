"""Timeouts that scale with the weights a run reads, when the config leaves them unset
(common/cluster/timeouts.py): a tiny model keeps the floor, FLUX.1-dev's bytes get minutes, a
set field wins, and a path this process cannot see gets the conservative default."""

from __future__ import annotations

from g2rpo.common.cluster.timeouts import (
    FLOOR_S,
    SHARED_READ_BYTES_PER_S,
    UNKNOWN_S,
    collective_timeout_s,
    worker_start_timeout_s,
)
from g2rpo.common.config.loading import load_config


def _pipeline(root, sizes: dict[str, int]):
    for component, nbytes in sizes.items():
        (root / component).mkdir(parents=True)
        with (root / component / "model.safetensors").open("wb") as f:
            f.truncate(int(nbytes))  # sparse: no disk used
        (root / component / "config.json").write_text("{}")  # not a weight file
    return root


def test_timeouts_scale_with_the_weights_on_disk(tmp_path):
    gb = 10**9
    flux = _pipeline(
        tmp_path / "flux",
        {
            "transformer": 23.8 * gb,
            "text_encoder_2": 9.5 * gb,
            "vae": gb // 6,
            "text_encoder": gb // 4,
        },
    )
    cfg = load_config(None, [f"model.pretrained={flux}"])
    assert collective_timeout_s(cfg) == FLOOR_S + 2 * 23.8e9 / SHARED_READ_BYTES_PER_S  # ~18 min
    assert 15 * 60 < collective_timeout_s(cfg) < 20 * 60
    assert 10 * 60 < worker_start_timeout_s(cfg) < 15 * 60
    tiny = load_config(None, ["model.pretrained=assets/shapes-world/pipeline"])
    assert FLOOR_S <= collective_timeout_s(tiny) < FLOOR_S + 1
    gone = load_config(None, ["model.pretrained=/nowhere/FLUX.1-dev"])
    assert collective_timeout_s(gone) == worker_start_timeout_s(gone) == UNKNOWN_S
    set_ = ["train.collective_timeout_s=30", "train.workers.start_timeout_s=40"]
    fixed = load_config(None, [f"model.pretrained={flux}", *set_])
    assert (collective_timeout_s(fixed), worker_start_timeout_s(fixed)) == (30, 40)
