"""The rates a doctor run measured, as calibration rows (``g2rpo doctor
--calibration-out FILE``; ``g2rpo plan --calibration FILE`` reads them)."""

from __future__ import annotations

import datetime

from ..common.config.run import G2RPOConfig
from .calibration import Rate
from .doctor_report import DoctorReport


def device_name(device: str) -> str:
    """'cpu', or the GPU's name as torch reports it (the table's ``device``)."""
    import torch

    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type


def rates_from_report(cfg: G2RPOConfig, rep: DoctorReport, device: str) -> list[Rate]:
    """One row per rate the report's passed phases measured: the rollout's sample
    TFLOP/s, its VAE decodes' TFLOP/s (FLOPs counted for the config's VAE), its
    seconds per prompt encoded, the update's TFLOP/s (full fine-tune or LoRA), and the
    host copies' GB/s each way (pinned host memory where the device has it: what the
    colocated offload copies through; the pageable rates stay in the report).
    """
    from .calibration import model_key
    from .estimate import _latent_hw, architecture
    from .flop_trace import vae_decode_flops

    phases = {p.phase: p for p in rep.phases if p.ok}
    archs, _ = architecture(cfg)
    model = model_key(archs["transformer"])
    where = f"g2rpo doctor {rep.config} ({rep.architecture})"
    today = datetime.date.today().isoformat()
    rows: list[Rate] = []

    def add(quantity: str, value: float, setting: str) -> None:
        if value > 0:
            rows.append(
                Rate(
                    device=device,
                    quantity=quantity,
                    value=float(f"{value:.5g}"),
                    model=model,
                    source="measured",
                    setting=setting,
                    where=where,
                    date=today,
                )
            )

    roll = phases.get("rollout")
    if roll is not None:
        d = roll.details
        shape = f"{cfg.train.image_size}², {cfg.model.rollout_weights_dtype or cfg.model.dtype}"
        made = f"{d['nfe']} NFEs, {d['leaves']} leaves, {shape}"
        add("sample_tflops", d.get("tflops", 0.0), made)
        if d.get("decode_s"):
            flops = vae_decode_flops(archs["vae"], _latent_hw(archs, cfg))
            batch = cfg.sampling.decode_batch
            add(
                "decode_tflops",
                d["leaves"] * flops / d["decode_s"] / 1e12,
                f"{d['leaves']} decodes, decode_batch {batch}, {shape}",
            )
        if d.get("encode_s"):
            prompts = cfg.sampling.prompts_per_worker
            add("encode_s_per_prompt", d["encode_s"] / prompts, f"{prompts} prompts")
    copy = phases.get("host copy")  # (doctor_transfer.py) the offload's copies' rate
    if copy is not None:
        from .doctor_transfer import offload_kind

        d = copy.details
        kind = offload_kind(d["gbps"])
        for way, name in (("d2h", "device to host"), ("h2d", "host to device")):
            size = f"{d['bytes'] / 2**20:g} MiB"
            add("host_copy_gbps", d["gbps"][kind][way], f"{kind} host memory, {name}, {size}")
    learn = phases.get("learn")
    if learn is not None and learn.details.get("tflops"):
        d = learn.details
        kind = "learn_lora_tflops" if cfg.model.lora is not None else "learn_tflops"
        add(
            kind,
            d["tflops"],
            f"{d['learner_forwards']} forwards, {d['optimizer_steps']} optimizer steps, "
            f"model.mixed_precision {cfg.model.mixed_precision}",
        )
    return rows
