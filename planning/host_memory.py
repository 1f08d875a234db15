"""What each process of a run holds in host memory (RAM, not its GPU's), phase by
phase: ``g2rpo plan``'s host section and ``g2rpo doctor``'s node check
(``host_nodes.py`` sums the processes of each node and its object store).

The phases of a run: load (each actor reads its model), rollout, publish (learner rank
0 gathers a version and puts it in the object store; the workers load it), learn,
checkpoint and export (the finished run's weights). Per process, from the model's sizes
and what the code keeps on the host in each:

rollout worker, evaluator (``rollout_worker/worker.py``)
  load     each pipeline component is read on the host, then moved to ``model.device``,
           one at a time (``family_components.load``): the largest, as it is held.
  rollout  its decoded images (uint8, scored from the host) and its trajectory batch,
           copied to the host before Ray puts it (``RolloutWorkerCore.trajectories``).
  publish  nothing private: the version is read in place from the node's object store
           (``common/wire/weights.load_published``; ``g2rpo bench weights-memory``).
  colocated: its transformer waits on the host from the end of its rollout (``offload``)
           to its next one: publish, learn, checkpoint, export.
learner rank (``learner/trainer.py``, ``learner/actor.py``)
  load     sharded (a full fine-tune in a group): rank 0 reads the whole transformer in
           float32 (``read_transformer``; a KL reference copies it before sharding), the
           other ranks build it on the meta device; unsharded: each rank reads it on
           the host in its base dtype before moving it.
  colocated: from its step aside after a publish to the next update, its state waits on
           the host (``LearnerCore.offload``): float32 weights (its shard), AdamW's two
           moments, a KL reference, a forward-process method's old copy; no gradients
           (every optimizer step frees them: ``zero_grad(set_to_none=True)``).
  publish  rank 0 gathers the version on the host (``full_weights`` in the rollout
           dtype), puts it and drops it before stepping aside (``Learner.publish``): the
           larger of the two. Collective transport: rank 0 holds ``versions_kept``
           versions from its first publish on (``StagedVersions``).
  checkpoint  sharded: torch.distributed.checkpoint stages a tensor at a time (counted
           as its largest block's shard);
           unsharded: rank 0 copies its trained state to the host (``state_dict``).
  export   sharded: rank 0 gathers every weight in float32 (``full_weights``).
reward replica: its scorers' weights pass through the host as it loads them.

A CPU run has no device: each actor's whole memory plan (``estimate.py``) is host memory
in every phase. Every process also holds a baseline (Python, torch, Ray's worker, the
CUDA runtime's host side): PROCESS_BYTES, an assumption, as are Ray's own processes
(``host_nodes.py``). Page cache (the model files read) is reclaimable and not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..common.config.algorithm import FORWARD_PROCESS
from ..common.config.run import G2RPOConfig
from ..learner.staged_versions import versions_kept
from .estimate import (
    _BYTES,
    SCORER_PARAMS,
    TEXT_ENCODERS,
    _latent_hw,
    guided,
    largest_share,
    latent_elements,
    parameter_counts,
    reward_scorer_names,
    text_tokens,
)
from .workload import kl_beta

GiB = 2**30
PHASES = ("load", "rollout", "publish", "learn", "checkpoint", "export")
# one process's own memory beside what it holds (assumed: Python + torch + a Ray worker
# ~1 GiB; a CUDA process adds the runtime's host side, cuBLAS/cuDNN and pinned pools)
PROCESS_BYTES = {"cuda": 3 * GiB, "cpu": 1 * GiB}
BASELINE = "process baseline (assumed)"


@dataclass
class ProcessHost:
    """``count`` alike processes of one kind, each holding ``phases[phase]`` (bytes by
    what they are) on the host."""

    actor: str
    count: int
    phases: dict[str, dict[str, int]] = field(default_factory=dict)

    def bytes(self, phase: str) -> int:
        return sum(self.phases[phase].values())


@dataclass(frozen=True)
class ModelSizes:
    """The byte counts the host plan is made of (``model_sizes``)."""

    params: int  # the transformer's parameters + persistent buffers
    adapters: int  # LoRA parameters (0: a full fine-tune)
    largest_block: int  # parameters of the transformer's largest block
    worker_transformer: int  # a worker's transformer on the host: rollout dtype + adapters
    worker_components: dict[str, int]  # every pipeline component as a worker holds it
    version: int  # one published version
    trajectory: int  # one worker's trajectory batch
    images: int  # one worker's decoded images of a rollout
    eval_images: int  # an evaluation's images (what the driver may receive)
    scorers: int  # one reward replica's scorer weights (bf16)


def _trajectory_bytes(cfg: G2RPOConfig, archs: dict) -> tuple[int, int]:
    """(one worker's trajectory batch, its decoded images) in bytes: float32 distinct
    states, next samples (and old means, clean leaves where the plan keeps them), the
    prompt embeddings; the leaves' uint8 RGB images."""
    from ..rollout_worker.plan import plan_for

    # the worker with the most prompts (train.workers.prompt_counts): the largest batch
    rollout = plan_for(cfg, 0, torch.Generator().manual_seed(0), largest_share(cfg))
    latent = latent_elements(archs, _latent_hw(archs, cfg)) * 4
    prefixes = [
        (leaf.root, leaf.edges[: d + 1])
        for leaf in rollout.leaves
        for d, edge in enumerate(leaf.edges)
        if edge.trained
    ]
    transitions = len(set(prefixes))
    states = len({(root, edges[:-1]) for root, edges in prefixes})
    rows = states + transitions * (2 if rollout.keep_means else 1)
    rows += len(rollout.leaves) if rollout.keep_leaves else 0
    tr = archs["transformer"]
    per_prompt = text_tokens(cfg, archs) * tr["joint_attention_dim"]
    per_prompt += tr.get("pooled_projection_dim", text_tokens(cfg, archs))
    per_prompt *= _BYTES[cfg.model.dtype] * (2 if guided(cfg, archs) else 1)
    batch = rows * latent + rollout.num_prompts * per_prompt
    images = len(rollout.leaves) * 3 * cfg.train.image_size**2
    return batch, images


def model_sizes(cfg: G2RPOConfig, archs: dict) -> ModelSizes:
    m = cfg.model
    lora = m.lora.model_dump() if m.lora is not None else None
    counts = parameter_counts("transformer", archs["transformer"], lora)
    params = counts["total"] + counts.get("buffers", 0)
    rollout_dtype = str(m.rollout_weights_torch_dtype()).removeprefix("torch.")
    worker_tr = params * _BYTES[rollout_dtype] + 4 * counts["adapters"]
    te_bytes = _BYTES[str(m.autocast_dtype() or torch.float32).removeprefix("torch.")]
    components = {
        "transformer": worker_tr,
        "VAE": 4 * parameter_counts("vae", archs["vae"])["total"],
    }
    for name, label in TEXT_ENCODERS[_family(archs)]:
        components[label] = te_bytes * parameter_counts(name, archs[name])["total"]
    published = str(m.rollout_weights_dtype or m.dtype)
    version = (counts["adapters"] if lora else params) * _BYTES[published]
    trajectory, images = _trajectory_bytes(cfg, archs)
    e = cfg.train.eval
    scorers = sum(int(2 * SCORER_PARAMS.get(n, 0)) for n in reward_scorer_names(cfg))
    return ModelSizes(
        params=params,
        adapters=counts["adapters"],
        largest_block=counts["largest_block"],
        worker_transformer=worker_tr,
        worker_components=components,
        version=version,
        trajectory=trajectory,
        images=images,
        eval_images=e.samples * e.per_prompt * 3 * cfg.train.image_size**2,
        scorers=scorers,
    )


def _family(archs: dict) -> str:
    from .estimate import family

    return family(archs)


def _every_phase(base: dict[str, int]) -> dict[str, dict[str, int]]:
    return {phase: dict(base) for phase in PHASES}


def worker_host(cfg: G2RPOConfig, s: ModelSizes, actor: str, count: int, device_peak: int):
    """A rollout worker's (or the evaluator's) host bytes per phase (module docstring)."""
    cuda = cfg.model.device.startswith("cuda")
    out = ProcessHost(
        actor, count, _every_phase({BASELINE: PROCESS_BYTES["cuda" if cuda else "cpu"]})
    )
    if not cuda:  # the device is the host: the whole plan, always
        for parts in out.phases.values():
            parts["its memory plan (device = host)"] = device_peak
        return out
    largest = max(s.worker_components, key=s.worker_components.get)
    out.phases["load"][f"{largest} read on the host before its move"] = s.worker_components[largest]
    if actor == "rollout worker":
        out.phases["rollout"]["decoded images (uint8)"] = s.images
        out.phases["rollout"]["trajectory batch before its put"] = s.trajectory
    if actor == "rollout worker" and offloads(cfg, "worker") == "all":
        for phase in ("publish", "learn", "checkpoint", "export"):
            out.phases[phase]["transformer offloaded (colocated)"] = s.worker_transformer
    return out


def offloads(cfg: G2RPOConfig, side: str) -> str | None:
    """What ``side`` (learner, worker) of a colocated pair moves to the host
    (``train.offload``, ``auto`` as the plan resolves it: planning/offload_choice.py; an
    unresolved ``auto`` moves everything, as the actors then do); None when not colocated."""
    if cfg.train.placement != "colocated":
        return None
    from .offload_choice import with_offload_chosen

    chosen = getattr(with_offload_chosen(cfg).train.offload, side)
    return "all" if chosen == "auto" else chosen


def hands_over_on_device(cfg: G2RPOConfig) -> bool:
    """A colocated full fine-tune's version goes from each rank's GPU to its worker's by
    CUDA IPC (orchestration/publishing.py ``IpcPublisher``): nothing of it on the host or
    in the object store, but for a fallback (a restarted worker, another device)."""
    return (
        cfg.train.placement == "colocated"
        and cfg.model.lora is None
        and cfg.model.device.startswith("cuda")
    )


def learner_state(cfg: G2RPOConfig, s: ModelSizes, sharded: bool, ranks: int) -> dict[str, int]:
    """What ``LearnerCore.offload`` moves to the host, per rank (no gradients)."""
    m = cfg.model
    share = ranks if sharded else 1
    if m.lora is not None:
        parts = {
            f"frozen base ({m.dtype})": s.params * _BYTES[m.dtype],
            "LoRA adapters (float32)": 4 * s.adapters,
            "AdamW moments (float32)": 8 * s.adapters,
        }
    else:
        parts = {
            "float32 weights" + (f" (1/{ranks})" if sharded else ""): 4 * s.params // share,
            "AdamW moments (float32)": 8 * s.params // share,
        }
    if kl_beta(cfg) > 0 and m.lora is None:
        parts["KL reference (float32)"] = 4 * s.params // share
    if cfg.algorithm.name in FORWARD_PROCESS:
        parts["old policy copy (float32)"] = 4 * (s.adapters or s.params) // share
    return parts


def learner_host(cfg: G2RPOConfig, s: ModelSizes, rank0: bool, count: int, device_peak: int):
    """A learner rank's host bytes per phase (rank 0's, or any other's; module docstring)."""
    from ..learner.trainer import sharded_learner

    t, m = cfg.train, cfg.model
    cuda = m.device.startswith("cuda")
    sharded = sharded_learner(cfg)
    out = ProcessHost(
        "learner rank 0" if rank0 else "learner rank",
        count,
        _every_phase({BASELINE: PROCESS_BYTES["cuda" if cuda else "cpu"]}),
    )
    ph = out.phases
    trained = 4 * (s.adapters or s.params)  # a rank's whole trained state in float32
    if rank0:
        if not hands_over_on_device(cfg):  # (by CUDA IPC it never reaches the host)
            ph["publish"]["gathered version (dropped before stepping aside)"] = s.version
        if t.weights.transport == "collective":  # held from the first publish on
            staged = versions_kept(t.weights.staleness) * s.version
            for phase in PHASES[1:]:
                ph[phase]["staged versions (collective transport)"] = staged
        if not sharded:  # torch.save of state_dict(): the trained state copied first
            ph["checkpoint"]["trained state copied (float32)"] = trained
        if sharded:  # full_weights: every weight in float32 on rank 0's host
            ph["export"]["every weight gathered in float32"] = 4 * s.params
        elif cuda and m.lora is None:  # save_pretrained copies a file's tensors at a time
            ph["export"]["a saved file's tensors copied (<= 10 GB)"] = min(trained, 10**10)
    if not cuda:  # the device is the host: the whole plan in every phase
        for parts in ph.values():
            parts["its memory plan (device = host)"] = device_peak
        return out
    if sharded:
        if rank0:
            copies = 2 if kl_beta(cfg) > 0 else 1
            label = "transformer read in float32" + (" + its KL reference" if copies > 1 else "")
            ph["load"][label] = copies * 4 * s.params
            # a tensor at a time: at most its largest block's shard
            staged = 4 * s.largest_block // t.learner.count
            ph["checkpoint"]["one tensor staged (float32)"] = staged
    else:
        base = _BYTES[str(m.base_weights_dtype()).removeprefix("torch.")]
        ph["load"]["transformer read on the host before its move"] = s.params * base
    mode = offloads(cfg, "learner")
    if mode in ("optimizer", "all"):
        state = learner_state(cfg, s, sharded, t.learner.count)
        if mode == "optimizer":  # AdamW's moments alone
            state = {k: v for k, v in state.items() if k.startswith("AdamW")}
        for part, n in state.items():
            ph["rollout"][f"{part}, offloaded (colocated)"] = n
        # publish: rank 0 gathers with its state on the device, drops the version, then
        # steps aside; the phase's peak is the larger of the two
        gathered = ph["publish"].pop("gathered version (dropped before stepping aside)", 0)
        if gathered > sum(state.values()):
            ph["publish"]["gathered version (dropped before stepping aside)"] = gathered
        else:
            for part, n in state.items():
                ph["publish"][f"{part}, offloaded (colocated)"] = n
    return out


def reward_host(cfg: G2RPOConfig, s: ModelSizes, count: int) -> ProcessHost:
    cuda = cfg.train.reward.num_gpus > 0
    out = ProcessHost(
        "reward replica", count, _every_phase({BASELINE: PROCESS_BYTES["cuda" if cuda else "cpu"]})
    )
    if s.scorers:
        key = "scorer weights" + (" read before their move" if cuda else "")
        for phase in PHASES if not cuda else ("load",):
            out.phases[phase][key] = s.scorers
    return out


def driver_host(s: ModelSizes) -> ProcessHost:
    """The driver (``g2rpo train`` on the head): an evaluation's images at most."""
    out = ProcessHost("driver", 1, _every_phase({BASELINE: PROCESS_BYTES["cpu"]}))
    for phase in ("rollout", "learn", "checkpoint"):
        out.phases[phase]["an evaluation's images (uint8)"] = s.eval_images
    return out
