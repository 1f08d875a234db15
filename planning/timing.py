"""How long an iteration takes, phase by phase, and the run's GPU-hours.

Each phase is its work (``workload.py``: NFEs, images, forwards, bytes; FLOPs counted on
fake tensors, ``flop_trace.py``) divided by a rate of the calibration table
(``calibration.py``). The phases follow the driver's critical path (orchestration's
``time/<phase>_s``): publish, rollout (with the held-out evaluation's slice when the
workers evaluate, and a colocated worker's moves), reward, learn (with a colocated
rank's moves), and the checkpoint's and the evaluation's time spread over the
iterations between them. An evaluator actor works beside the rollout: its time is
reported, and only what it takes beyond its iterations counts.

What is not modelled: text encoding beyond its per-prompt rate, FSDP's communication
(the rates are one rank's), stragglers, Ray's scheduling, a cold start's model loading.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..common.config import G2RPOConfig
from .calibration import Calibration, Looked, model_key
from .estimate import _latent_hw, architecture, gpus_asked, guided, parameter_counts
from .flop_trace import SCORER_FLOPS, transformer_flops, vae_decode_flops
from .workload import dtype_bytes, workload

GB = 1e9


@dataclass
class Timing:
    device: str
    phases: dict[str, float]  # seconds per iteration on the critical path
    beside: dict[str, float]  # seconds of work off it (an evaluator's)
    rates: list[Looked]
    iterations: int
    gpus: float
    notes: list[str] = field(default_factory=list)

    @property
    def iteration_s(self) -> float:
        return sum(self.phases.values())

    @property
    def run_hours(self) -> float:
        return self.iteration_s * self.iterations / 3600

    @property
    def gpu_hours(self) -> float:
        return self.run_hours * self.gpus


class _Rates:
    """Looks rates up once each and remembers which were used."""

    def __init__(self, cal: Calibration) -> None:
        self.cal, self.used = cal, {}

    def __call__(self, quantity: str) -> float:
        if quantity not in self.used:
            self.used[quantity] = self.cal.rate(quantity)
        return self.used[quantity].value


def scorer_flops(cfg: G2RPOConfig) -> float:
    from .estimate import reward_scorer_names

    return sum(SCORER_FLOPS.get(name, 0.0) for name in reward_scorer_names(cfg))


def estimate_time(cfg: G2RPOConfig, cal: Calibration) -> Timing:
    """Seconds per phase of one iteration of ``cfg`` at ``cal``'s rates."""
    archs, _ = architecture(cfg)
    t, m = cfg.train, cfg.model
    rate = _Rates(Calibration(cal.device, cal.rows, model_key(archs["transformer"])))
    work = workload(cfg)
    hw = _latent_hw(archs, cfg)
    nfe_flops = transformer_flops(
        archs["transformer"], hw, t.max_sequence_length, **guided(cfg, archs)
    )
    decode_flops = vae_decode_flops(archs["vae"], hw)
    lora = m.lora.model_dump() if m.lora is not None else None
    counts = parameter_counts("transformer", archs["transformer"], lora)
    # a colocated pair moves its state between the device and the host (none on a CPU)
    moves = t.placement == "colocated" and cal.device != "cpu"
    notes: list[str] = []

    def sample_s(nfe: int, images: int) -> float:
        return nfe * nfe_flops / (rate("sample_tflops") * 1e12) + images * decode_flops / (
            rate("decode_tflops") * 1e12
        )

    # publish: the rollout weights (LoRA: the adapters) to every worker
    rollout_bytes = counts["total"] * dtype_bytes(m.rollout_weights_dtype or m.dtype)
    published = 4 * counts["adapters"] if lora else rollout_bytes
    transport = "broadcast_gbps" if t.weights.transport == "collective" else "object_store_gbps"
    phases = {"publish": published / (rate(transport) * GB)}

    # rollout: encode, sample, decode; the workers' slice of an evaluation; a colocated
    # worker brings its transformer back and puts it away again
    rollout = work.prompts_per_worker * rate("encode_s_per_prompt")
    rollout += sample_s(work.nfe_per_worker, work.images_per_worker)
    every = t.eval.every if t.eval.every_nfe is None else None
    eval_work = sample_s(work.eval_samples * work.eval_nfe_per_sample, work.eval_samples)
    beside, evaluation = {}, 0.0
    if t.eval.on_actor:
        beside["evaluation (evaluator actor)"] = eval_work
    elif every:  # each worker's slice, before its rollout, every N iterations
        evaluation = eval_work / t.workers.count / every
    if t.eval.every_nfe is not None and not t.eval.on_actor:
        notes.append("train.eval.every_nfe: the workers' evaluations are not counted")
    if moves:
        rollout += 2 * rollout_bytes / (rate("host_copy_gbps") * GB)
    phases["rollout"] = rollout
    if evaluation:
        phases["evaluation (workers' slices, per iteration)"] = evaluation

    # reward: each worker's request bodies (raw 8-bit RGB) and the replicas' forwards
    images = work.images_per_worker * t.workers.count
    body = 3 * t.image_size**2 * work.images_per_worker
    reward = body / (rate("reward_transfer_gbps") * GB)
    score = scorer_flops(cfg)
    gpus = t.reward.job_replicas() * t.reward.num_gpus
    if score and gpus > 0:
        try:
            reward += images * score / (rate("score_tflops") * 1e12 * gpus)
        except KeyError as e:
            notes.append(f"reward: {e.args[0]}: the scorers' compute is not counted")
    elif score:
        notes.append(
            "reward: the scorers run off the job's GPUs (an external server): their "
            "compute is not counted"
        )
    phases["reward"] = reward

    # learn: the group's forwards (and backwards), split over the ranks
    from ..common.flops import update_flops
    from ..learner.trainer import sharded_learner

    ranks = t.learner.count
    flops = update_flops(
        nfe_flops,
        work.learner_forwards,
        work.learner_no_grad,
        m.gradient_checkpointing,
        frozen_base=lora is not None,
    )
    learn = flops / ranks / (rate("learn_lora_tflops" if lora else "learn_tflops") * 1e12)
    trainable = counts["adapters"] if lora else counts["total"]
    state = (4 + 4 + 8) * trainable  # float32 weights, gradients, AdamW's two moments
    if lora:
        state += counts["total"] * dtype_bytes(m.dtype)  # the frozen base moves too
    per_rank = state / (ranks if sharded_learner(cfg) else 1)
    if moves:
        learn += 2 * per_rank / (rate("host_copy_gbps") * GB)
    phases["learn"] = learn

    # checkpoint: float32 weights and AdamW's moments, written every N iterations
    ck = t.checkpoints
    if ck.every:
        phases["checkpoint"] = (4 + 8) * trainable / (rate("checkpoint_gbps") * GB) / ck.every

    if t.eval.on_actor and every:
        # the evaluator runs beside the iterations; the driver waits only for its excess
        spare = eval_work - every * sum(phases.values())
        if spare > 0:
            phases["evaluation wait"] = spare / every
    return Timing(
        device=cal.device,
        phases=phases,
        beside=beside,
        rates=list(rate.used.values()),
        iterations=cfg.run.iterations,
        gpus=gpus_asked(cfg),
        notes=notes,
    )


def default_device(cfg: G2RPOConfig) -> str:
    """The calibrated device a plan estimates for when none is named: the CPU for a CPU
    run, else the GPU the shipped table measured."""
    return "cpu" if cfg.model.device == "cpu" else "H200"


def time_report(cfg: G2RPOConfig, cal: Calibration) -> dict:
    """The estimate as plain data (``g2rpo plan``'s JSON and table)."""
    tm = estimate_time(cfg, cal)
    return {
        "device": tm.device,
        "phases_s": {k: round(v, 2) for k, v in tm.phases.items()},
        "beside_s": {k: round(v, 2) for k, v in tm.beside.items()},
        "iteration_s": round(tm.iteration_s, 2),
        "iterations": tm.iterations,
        "run_hours": round(tm.run_hours, 2),
        "gpus": tm.gpus,
        "gpu_hours": round(tm.gpu_hours, 1),
        "rates": [r.model_dump() for r in tm.rates],
        "notes": tm.notes,
    }


def format_time(rep: dict) -> str:
    lines = [f"time per iteration on {rep['device']} (calibration table; `g2rpo plan --help`):"]
    for phase, s in rep["phases_s"].items():
        lines.append(f"    {s:>9.1f} s  {phase}")
    for what, s in rep["beside_s"].items():
        lines.append(f"    ({s:>7.1f} s  {what}, beside the iterations)")
    gpus = f", {rep['gpu_hours']:g} GPU-hours on {rep['gpus']:g} GPUs" if rep["gpus"] else ""
    lines.append(
        f"    {rep['iteration_s']:>9.1f} s  an iteration; {rep['iterations']} iterations: "
        f"{rep['run_hours']:.2f} h{gpus}"
    )
    assumed = [r for r in rep["rates"] if r["basis"] != "measured" or r["note"]]
    if assumed:
        said = ", ".join(
            f"{r['quantity']} {r['value']:g} ({r['basis']}{', ' + r['note'] if r['note'] else ''})"
            for r in assumed
        )
        lines.append(f"    rates not measured on this device and model: {said}")
    lines += [f"    note: {n}" for n in rep["notes"]]
    return "\n".join(lines)
