"""The calibration table: measured rates per device, which the time estimate divides
the iteration's work by.

A row is one rate of one device (``quantity``: what was timed, in its unit), where it
came from, and whether it was measured or assumed. The package ships
``presets/calibration.json``; ``g2rpo doctor --calibration-out FILE`` appends the rates
its phases measured on the node it ran on, and ``g2rpo plan --calibration FILE`` reads
them beside the shipped ones. Where a device has several rows of a quantity the
median is taken: of the rows measured on the run's own transformer when there are
some (a CPU's rate on a test-size model is 30x off on another), measured rows before
assumed ones; a GPU without rows borrows the
nearest measured GPU's compute rates scaled by the datasheet bf16 peaks (and its
transfer rates as they are), and says so.
"""

from __future__ import annotations

import json
import statistics
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..common.algorithms.flops import BF16_PEAK_TFLOPS

SHIPPED = "calibration.json"  # in planning/presets/

QUANTITIES = {
    "sample_tflops": "TFLOP/s of the transformer's no-grad sample forwards (engine time)",
    "decode_tflops": "TFLOP/s of VAE decodes",
    "encode_s_per_prompt": "seconds to encode one prompt (CLIP + T5)",
    "learn_tflops": "TFLOP/s of a full fine-tune's update (forward, backward, optimizer)",
    "learn_lora_tflops": "TFLOP/s of a LoRA update",
    "score_tflops": "TFLOP/s of a reward model's forward",
    "reward_transfer_gbps": "GB/s of reward request bodies, one worker to the servers",
    "host_copy_gbps": "GB/s moving tensors between the device and the host, one direction",
    "object_store_gbps": "GB/s of a weight version through Ray's object store (put, get, load)",
    "broadcast_gbps": "GB/s of a weight version broadcast over the collective transport",
    "ipc_copy_gbps": "GB/s of a version handed over inside one GPU (colocated: CUDA IPC "
    "buckets copied into the worker's weights, both device checksums)",
    "checkpoint_gbps": "GB/s writing a checkpoint to the run directory",
    # a ring collective's bus bandwidth: a rank's (n-1)/n x size bytes move at this rate
    "nvlink_gbps": "GB/s bus bandwidth of the learner ranks' collectives within a node",
    "ib_gbps": "GB/s bus bandwidth of the learner ranks' collectives across InfiniBand",
    "tcp_gbps": "GB/s bus bandwidth of the learner ranks' collectives across TCP Ethernet",
}
COMPUTE = ("sample_tflops", "decode_tflops", "learn_tflops", "learn_lora_tflops", "score_tflops")


class Rate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str = Field(description="'cpu', or the GPU's name as torch reports it")
    quantity: Literal[tuple(QUANTITIES)]  # type: ignore[valid-type]
    value: float = Field(gt=0)
    source: Literal["measured", "assumed"]
    model: str = Field(
        "", description="the transformer it ran (model_key: blocks x width), '' for any"
    )
    setting: str = Field(description="what ran, or why the value is assumed")
    where: str = Field("", description="the file or document holding the measurement")
    date: str = ""


class Looked(BaseModel):
    """A rate the estimate used, and how it was found."""

    quantity: str
    value: float
    basis: Literal["measured", "assumed", "scaled"]
    rows: int
    note: str = ""


@lru_cache(maxsize=1)
def shipped_rates() -> tuple[Rate, ...]:
    text = resources.files(__package__).joinpath("presets", SHIPPED).read_text()
    return tuple(Rate(**row) for row in json.loads(text)["rates"])


def read_rates(path: str | Path) -> list[Rate]:
    """Rows of a calibration file: JSON lines, as the doctor appends them."""
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(Rate(**json.loads(line)))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a calibration row: {e}") from None
    return rows


def append_rates(path: str | Path, rows: list[Rate]) -> None:
    with open(path, "a") as f:
        for r in rows:
            f.write(r.model_dump_json() + "\n")


def _matches(row_device: str, device: str) -> bool:
    a, b = row_device.lower(), device.lower()
    return a == b or (b != "cpu" and a != "cpu" and (b in a or a in b))


def _peak(device: str) -> float | None:
    for key, peak in BF16_PEAK_TFLOPS.items():
        if key.lower() in device.lower():
            return peak
    return None


def model_key(transformer: dict) -> str:
    """A transformer's shape as rows name it: double + single blocks x width
    (FLUX.1-dev: '19+38x3072'). A rate measured on one model is taken for another only
    when the device has none of that model."""
    width = transformer["num_attention_heads"] * transformer["attention_head_dim"]
    single = transformer.get("num_single_layers", 0)  # SD3 has one kind of layer
    return f"{transformer['num_layers']}+{single}x{width}"


class Calibration:
    """Rates for one device (and, where rows name it, one model) from a set of rows."""

    def __init__(self, device: str, rows: list[Rate] | tuple[Rate, ...], model: str = "") -> None:
        self.device, self.model = device, model
        self.rows = list(rows)

    def _own(self, device: str, quantity: str) -> list[Rate]:
        mine = [r for r in self.rows if r.quantity == quantity and _matches(r.device, device)]
        same = [r for r in mine if self.model and r.model == self.model]
        mine = same or mine
        measured = [r for r in mine if r.source == "measured"]
        return measured or mine

    def rate(self, quantity: str) -> Looked:
        own = self._own(self.device, quantity)
        if own:
            value = statistics.median(r.value for r in own)
            models = sorted({r.model for r in own if r.model})
            note = ""
            if self.model and models and self.model not in models:
                note = f"on {', '.join(models)}, not {self.model}"
            return Looked(
                quantity=quantity, value=value, basis=own[0].source, rows=len(own), note=note
            )
        if self.device != "cpu":  # a GPU without rows: the nearest calibrated GPU's
            for other in dict.fromkeys(r.device for r in self.rows if r.device != "cpu"):
                own = self._own(other, quantity)
                if not own:
                    continue
                value = statistics.median(r.value for r in own)
                note = f"{other}'s rate"
                mine, theirs = _peak(self.device), _peak(other)
                if quantity in COMPUTE and mine and theirs:
                    value *= mine / theirs
                    note += f" x bf16 peak {mine:g}/{theirs:g}"
                return Looked(
                    quantity=quantity, value=value, basis="scaled", rows=len(own), note=note
                )
        raise KeyError(f"no calibration row of {quantity} for {self.device!r} or any GPU")


def calibration(
    device: str, extra: list[str] | tuple[str, ...] = (), model: str = ""
) -> Calibration:
    rows = list(shipped_rates())
    for path in extra:
        rows += read_rates(path)
    return Calibration(device, rows, model)
