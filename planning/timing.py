"""How long an iteration takes, phase by phase, and the run's GPU-hours.

Each phase is its work (``workload.py``: NFEs, images, forwards, bytes; FLOPs counted on
fake tensors, ``flop_trace.py``) divided by a rate of the calibration table
(``calibration.py``). The phases follow the driver's critical path (orchestration's
``time/<phase>_s``): publish, rollout (with the held-out evaluation's slice when the
workers evaluate, and a colocated worker's moves), reward, learn (with a colocated
rank's moves), and the checkpoint's and the evaluation's time spread over the
iterations between them. An evaluator actor works beside the rollout: its time is
reported, and only what it takes beyond its iterations counts.

FSDP2's communication between learner ranks (``communication.py``) is counted from its
bytes per pass over the link the group crosses (NVLink within a node, ``--network``
between nodes), the part no compute hides added to the learn phase, a sharded version's
gather to the publish phase. A colocated pair's moves follow ``train.offload``: none for
a side that keeps its tensors resident.

What is not modelled: text encoding beyond its per-prompt rate, stragglers, Ray's
scheduling, a cold start's model loading, collectives slowing the compute they overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..common.config.run import G2RPOConfig
from .calibration import Calibration, Looked, model_key
from .communication import RATE, exposed_seconds, learner_traffic
from .estimate import _latent_hw, architecture, gpus_asked, guided, parameter_counts
from .flop_trace import SCORER_FLOPS, transformer_flops, vae_decode_flops
from .host_memory import hands_over_on_device
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
    # the learner group's collectives: link, GB/s, GB per rank, seconds, seconds exposed
    communication: dict = field(default_factory=dict)

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


def offload_modes(cfg: G2RPOConfig) -> tuple[str, str]:
    """(learner, worker): what each side of a colocated pair keeps on the host while the
    other has the GPU (``train.offload``), ``auto`` resolved as the run resolves it
    (planning/offload_choice.py: the least offload whose every moment fits the pair's
    GPU; ``all`` where it has nothing to choose)."""
    o = cfg.train.offload
    learner, worker = o.learner, o.worker
    if "auto" in (learner, worker):
        chosen = _auto_offload(cfg)
        learner = chosen[0] if learner == "auto" else learner
        worker = chosen[1] if worker == "auto" else worker
    return learner, worker


def _auto_offload(cfg: G2RPOConfig) -> tuple[str, str]:
    from .offload_choice import resolve_offload

    choice = resolve_offload(cfg)  # None: nothing to choose (a CPU run, disaggregated)
    return ("all", "all") if choice is None else (choice.learner, choice.worker)


def learner_moved_bytes(mode: str, trainable: int, frozen: int, ranks: int) -> int:
    """Bytes one rank moves to the host (and back) per iteration under offload ``mode``:
    AdamW's float32 moments (optimizer), or the float32 weights with them and a LoRA
    run's frozen base (all). Gradients are freed after each step (set_to_none): none."""
    if mode == "none":
        return 0
    moments = 8 * trainable // ranks
    if mode == "optimizer":
        return moments
    return moments + 4 * trainable // ranks + frozen


def estimate_time(
    cfg: G2RPOConfig, cal: Calibration, network: str = "ib", gpus_per_node: int = 8
) -> Timing:
    """Seconds per phase of one iteration of ``cfg`` at ``cal``'s rates; a learner group
    spanning nodes of ``gpus_per_node`` GPUs talks across ``network`` (nvlink, ib, tcp)."""
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
    # a colocated pair moves its state between the device and the host (none on a CPU),
    # each side as train.offload says
    moves = t.placement == "colocated" and cal.device != "cpu"
    learner_offload, worker_offload = offload_modes(cfg)
    notes: list[str] = []
    if moves:
        o = t.offload
        chosen = " (auto: the plan's choice)" if "auto" in (o.learner, o.worker) else ""
        notes.append(
            f"train.offload: learner {learner_offload}, worker {worker_offload}{chosen}: "
            "moves counted only for a side that offloads"
        )

    def sample_s(nfe: int, images: int) -> float:
        return nfe * nfe_flops / (rate("sample_tflops") * 1e12) + images * decode_flops / (
            rate("decode_tflops") * 1e12
        )

    # publish: the rollout weights (LoRA: the adapters) to every worker
    rollout_bytes = counts["total"] * dtype_bytes(m.rollout_weights_dtype or m.dtype)
    published = 4 * counts["adapters"] if lora else rollout_bytes
    transport = "broadcast_gbps" if t.weights.transport == "collective" else "object_store_gbps"
    if hands_over_on_device(cfg):  # each rank's GPU to its worker's (publishing.IpcPublisher)
        transport = "ipc_copy_gbps"
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
    if moves and worker_offload == "all":
        rollout += 2 * rollout_bytes / (rate("host_copy_gbps") * GB)
    phases["rollout"] = rollout
    if evaluation:
        phases["evaluation (workers' slices, per iteration)"] = evaluation

    # reward: each worker's request bodies (raw 8-bit RGB) and the replicas' forwards
    images = work.images_total
    body = 3 * t.image_size**2 * work.images_per_worker
    reward = body / (rate("reward_transfer_gbps") * GB)
    score = scorer_flops(cfg)
    # a replica in a pair (train.reward.in_pairs) scores on the pair's GPU while the
    # pair's worker waits for its scores: the whole GPU, whatever share Ray counts
    share = 1.0 if t.reward.in_pairs and t.reward.num_gpus > 0 else t.reward.num_gpus
    gpus = t.reward.job_replicas() * share
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
    from ..common.algorithms.flops import update_flops
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
    sharded = sharded_learner(cfg)
    communication: dict = {}
    traffic = learner_traffic(cfg, work, counts, sharded, network, gpus_per_node)
    if traffic is not None and traffic.learn:
        try:
            link = rate(RATE[traffic.link])
        except KeyError as e:
            notes.append(f"learn: {e.args[0]}: the learner group's communication is not counted")
        else:
            exposed = exposed_seconds(traffic, link, learn)
            communication = {
                "link": traffic.link,
                "gbps": link,
                "ranks": traffic.ranks,
                "passes": work.learner_passes if sharded else 0,
                "gb_per_pass": traffic.per_pass / GB,
                "gb_per_rank": traffic.learn / GB,
                "seconds": traffic.learn / (link * GB),
                "exposed_s": exposed,
                "compute_s": learn,
            }
            learn += exposed
            if traffic.publish:  # rank 0's version is gathered from every rank's shards
                phases["publish"] += traffic.publish / (link * GB)
    frozen = counts["total"] * dtype_bytes(m.dtype) if lora else 0  # the base moves too
    per_rank = learner_moved_bytes(learner_offload, trainable, frozen, ranks if sharded else 1)
    if moves and per_rank:
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
        communication=communication,
    )


def default_device(cfg: G2RPOConfig) -> str:
    """The calibrated device a plan estimates for when none is named: the CPU for a CPU
    run, else the GPU the shipped table measured."""
    return "cpu" if cfg.model.device == "cpu" else "H200"


def time_report(
    cfg: G2RPOConfig, cal: Calibration, network: str = "ib", gpus_per_node: int = 8
) -> dict:
    """The estimate as plain data (``g2rpo plan``'s JSON and table)."""
    tm = estimate_time(cfg, cal, network, gpus_per_node)
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
        "communication": {
            k: round(v, 2) if isinstance(v, float) else v for k, v in tm.communication.items()
        },
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
    c = rep.get("communication")
    if c:
        per = f"{c['gb_per_pass']:.1f} GB a pass x {c['passes']} passes = " if c["passes"] else ""
        lines.append(
            f"    learner collectives over {c['link']} ({c['gbps']:g} GB/s), {c['ranks']} ranks: "
            f"{per}{c['gb_per_rank']:.1f} GB per rank, {c['seconds']:.1f} s, of which "
            f"{c['exposed_s']:.1f} s beyond the {c['compute_s']:.1f} s of compute that hides it"
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
