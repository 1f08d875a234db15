"""Each actor's peak device memory for a run's config, and what it is made of.

Weights, gradients, optimizer state, FSDP shards and gather buffers are counted from
the architecture (components.py, built on the meta device); activations come from
fake-tensor traces (``trace.py``), which scale linearly in the batch. A learner's
figure is the steady state of an update with more than one micro-batch per optimizer
step: weights + the previous micro-batch's gradients + AdamW's states + one
micro-batch of ``train.learner.max_batch`` states' activations (an upper bound when a
micro-batch is all of an optimizer step, whose gradients only grow in its backward), or
the optimizer step's scratch where that is larger (AdamW's foreach kernel).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch

from ..common.config.run import G2RPOConfig
from ..common.families.flux_pipeline import latent_size
from .components import (
    architecture,
    family,
    guided,
    latent_elements,
    parameter_counts,
    text_tokens,
)
from .trace import transformer_activations, vae_decode_activations

GiB = 2**30
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Scorer weights (parameters) and one scoring batch's activations per image, in
# bfloat16 on a GPU: OpenCLIP ViT-H-14 (HPSv2, PickScore, CLIP score), BLIP ViT-L + BERT
# (ImageReward); the shapes world's CLIP is tiny; the others have no weights.
SCORER_PARAMS = {
    "hpsv2": 986e6,
    "pickscore": 986e6,
    "clip_score": 986e6,
    "image_reward": 450e6,
    "shapes_clip": 2e6,
}
SCORER_IMAGE_BYTES = 16 * 2**20  # ViT-H at 224²: 257 tokens × (5120 + 3·1280) × bf16 ×2
SCORING_BATCH = 64
# On CUDA the sampler's calls hold more than their CPU fake-tensor traces. Measured on an
# H200 (torch 2.11, cuDNN on, random FLUX.1-dev weights; docs/benchmarks.md, "The second
# GPU run"): a VAE decode of n images at 512² and 720² (n = 1, 4) held its traced bytes
# per image x (1.25 n + 0.33..0.38) (cuDNN's convolution workspaces and copies the trace
# does not see), and a 2+4-block transformer call 1.058..1.068x its trace. The factors are
# rounded up so every measured call is at or under them; they apply only to CUDA plans.
# (The prompt embeddings a sampler call gathers are counted on every device.)
CUDA_VAE_PER_IMAGE = 1.25
CUDA_VAE_PER_CALL = 0.39  # of one image's traced bytes, whatever the call's size
CUDA_SAMPLER_FORWARD = 1.07


def sampler_forward_call(per_sample: int, batch: int, embedding: int, cuda: bool) -> int:
    """Peak bytes of one no-grad transformer call of ``batch`` samples, from one
    sample's traced bytes, plus the prompt embeddings the engine gathers for the call
    (``embedding`` bytes a sample; the trace takes them as inputs), on any device."""
    return int((per_sample * (CUDA_SAMPLER_FORWARD if cuda else 1.0) + embedding) * batch)


def vae_decode_call(per_image: int, images: int, cuda: bool) -> int:
    """Peak transient bytes of one VAE decode call of ``images`` images, from one
    image's traced bytes."""
    if not cuda:
        return per_image * images
    return int(per_image * (CUDA_VAE_PER_IMAGE * images + CUDA_VAE_PER_CALL))


@dataclass
class ActorPlan:
    actor: str  # rollout worker, learner rank, evaluator, reward replica
    count: int  # actors of this kind
    gpus: float  # num_gpus each asks Ray for
    parts: dict[str, int] = field(default_factory=dict)  # bytes by what they are
    budget: int = 0  # bytes of the GPU share it may use
    on_gpu: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        if not self.on_gpu:
            return True
        return self.gpus > 0 and self.peak <= self.budget


@dataclass
class Plan:
    actors: list[ActorPlan]
    gpus_asked: float
    gpu_memory: int
    architecture: str

    @property
    def fits(self) -> bool:
        return all(a.fits for a in self.actors)


# ---------------------------------------------------------------- the actors


def _gb_budget(cfg: G2RPOConfig, gpus: float, gpu_memory: int) -> int:
    """Actors sharing a GPU through fractional num_gpus split its memory."""
    return int(gpu_memory * min(gpus, 1.0))


def _latent_hw(archs, cfg) -> tuple[int, int]:
    return latent_size(archs["vae"], cfg.train.image_size, cfg.train.image_size)


TEXT_ENCODERS = {
    "flux": (("text_encoder", "CLIP text encoder"), ("text_encoder_2", "T5 encoder")),
    "sd3": (
        ("text_encoder", "CLIP text encoder"),
        ("text_encoder_2", "CLIP-G text encoder"),
        ("text_encoder_3", "T5 encoder"),
    ),
    "qwenimage": (("text_encoder", "Qwen2.5-VL text encoder"),),
}


def _text_encoders(cfg, archs, parts: dict) -> None:
    te_bytes = _BYTES[cfg.model.dtype]  # the encoders and their outputs are in model.dtype
    for name, label in TEXT_ENCODERS[family(archs)]:
        parts[f"{label} weights"] = parameter_counts(name, archs[name])["total"] * te_bytes


def _sampler(cfg, archs, name: str, rows: int, leaves: int, live_states: int) -> ActorPlan:
    """A rollout worker or the evaluator (the same core): the pipeline's weights, the
    rollout tree's live latents, and the larger of one transformer call and one
    VAE decode call."""
    m, s = cfg.model, cfg.sampling
    lora = m.lora.model_dump() if m.lora is not None else None
    counts = parameter_counts("transformer", archs["transformer"], lora)
    w_dtype = str(m.rollout_weights_torch_dtype()).removeprefix("torch.")
    parts = {f"transformer weights ({w_dtype})": counts["total"] * _BYTES[w_dtype]}
    if counts.get("buffers"):
        parts[f"transformer buffers ({w_dtype})"] = counts["buffers"] * _BYTES[w_dtype]
    if counts["adapters"]:
        parts["LoRA adapters (float32)"] = counts["adapters"] * 4
    parts["VAE weights (float32)"] = parameter_counts("vae", archs["vae"])["total"] * 4
    _text_encoders(cfg, archs, parts)
    hw = _latent_hw(archs, cfg)
    parts["rollout tree latents"] = live_states * latent_elements(archs, hw) * 4
    batch = min(s.max_batch, rows)
    one = transformer_activations(
        archs["transformer"],
        batch=1,
        latent_hw=hw,
        text_tokens=cfg.train.max_sequence_length,
        weights_dtype=w_dtype,
        autocast_dtype=m.dtype if m.dtype != "float32" else None,
        train=False,
        checkpointing=False,
        lora=None,
        **guided(cfg, archs),
    )["bytes"]
    decode = min(s.decode_batch, leaves)
    cuda = m.device.startswith("cuda")
    vae = vae_decode_activations(archs["vae"], hw)
    tr = archs["transformer"]
    per_prompt = text_tokens(cfg, archs) * tr["joint_attention_dim"]
    # Qwen-Image: no pooled vector, a mask of one number a text row instead
    pooled = tr.get("pooled_projection_dim", text_tokens(cfg, archs))
    embedding = (per_prompt + pooled) * _BYTES[m.dtype]
    embedding *= 2 if guided(cfg, archs) else 1  # the empty prompt's rows beside each
    forward = sampler_forward_call(one, batch, embedding, cuda)
    decoding = vae_decode_call(vae, decode, cuda)
    if forward >= decoding:
        parts[f"transformer forward ({batch} samples and their prompt embeddings)"] = forward
    else:
        parts[f"VAE decode ({decode} images)"] = decoding
    return ActorPlan(actor=name, count=0, gpus=0.0, parts=parts)


def rollout_worker(cfg: G2RPOConfig, archs) -> ActorPlan:
    from ..rollout_worker.plan import plan_for

    plan = plan_for(cfg, 0, torch.Generator().manual_seed(0), largest_share(cfg))
    leaves = len(plan.leaves)
    live = plan.num_roots + 3 * plan.num_noises + leaves  # noise table, recorded pairs
    out = _sampler(cfg, archs, "rollout worker", leaves, leaves, live)
    out.count, out.gpus = cfg.train.workers.count, cfg.train.workers.num_gpus
    return out


def largest_share(cfg: G2RPOConfig) -> int:
    """The rollout worker with the most prompts (``train.workers.prompt_counts``): its
    rollout holds the most, so the plan is its."""
    shares = cfg.train.workers.prompt_shares(cfg.sampling.prompts_per_worker)
    return shares.index(max(shares))


def evaluator(cfg: G2RPOConfig, archs) -> ActorPlan:
    t = cfg.train
    samples = t.eval.samples * t.eval.per_prompt
    out = _sampler(cfg, archs, "evaluator", samples, samples, 2 * samples)
    out.count, out.gpus = 1, t.eval.num_gpus
    return out


def learner_rank(cfg: G2RPOConfig, archs) -> ActorPlan:
    from ..learner.optimizer import adamw_kernel
    from ..learner.trainer import sharded_learner

    m, t = cfg.model, cfg.train
    lora = m.lora.model_dump() if m.lora is not None else None
    counts = parameter_counts("transformer", archs["transformer"], lora)
    sharded = sharded_learner(cfg)
    ranks = t.learner.count if sharded else 1
    mp = m.mixed_precision == "fsdp"
    total = counts["total"]
    parts: dict[str, int] = {}
    if lora is None:
        trainable = total
        parts["weights (float32 master)" + (f", 1/{ranks}" if sharded else "")] = 4 * total // ranks
    else:
        trainable = counts["adapters"]
        parts[f"base weights ({m.dtype})"] = total * _BYTES[m.dtype]
        parts["LoRA adapters (float32)"] = 4 * trainable
    shard = f", 1/{ranks}" if sharded else ""
    parts[f"gradients (float32{shard})"] = 4 * trainable // ranks
    parts[f"AdamW states (2 x float32{shard})"] = 8 * trainable // ranks
    if sharded:  # the block being computed and the one prefetched, unsharded
        gather = _BYTES[m.dtype] if mp else 4
        parts["FSDP all-gather buffers (2 blocks)"] = 2 * counts["largest_block"] * gather
        # a block's gradients, unsharded in the compute dtype, until their reduce-scatter
        # (the H200's FSDP learner held one FLUX double block's beyond the terms above)
        parts["FSDP gradients being reduced (1 block)"] = counts["largest_block"] * gather
    if cfg.algorithm.name == "flowgrpo" and cfg.algorithm.flowgrpo.kl_beta > 0 and lora is None:
        parts[f"KL reference copy (float32{shard})"] = 4 * total // ranks
    hw = _latent_hw(archs, cfg)
    shape = dict(
        batch=1,
        latent_hw=hw,
        text_tokens=t.max_sequence_length,
        train=True,
        checkpointing=m.gradient_checkpointing,
        # LoRA's activations traced as the base trained in model.dtype: the adapters'
        # weight gradients need the same saved inputs (peft cannot wrap fake modules)
        lora=None,
        **guided(cfg, archs),
    )
    compute = m.dtype if m.dtype != "float32" else None
    base_dtype = m.dtype if lora is not None else "float32"
    # activations as computed in model.dtype (FSDP's policy gathers weights in it)
    acts = transformer_activations(
        archs["transformer"],
        weights_dtype=m.dtype if (mp or lora is not None) else "float32",
        autocast_dtype=None if mp else compute,
        **shape,
    )["bytes"]
    batch = t.learner.max_batch
    saved = "checkpointed" if m.gradient_checkpointing else "saved"
    if not mp and compute is not None and base_dtype == "float32":
        # autocast over float32 trainable weights caches a bf16 copy of each weight
        plain = transformer_activations(
            archs["transformer"], weights_dtype=m.dtype, autocast_dtype=compute, **shape
        )["bytes"]
        cache = max(acts - plain, 0)
        parts[f"activations ({batch} states, {saved})"] = plain * batch
        parts[f"autocast cache ({m.dtype} weight copies)"] = cache
    else:
        parts[f"activations ({batch} states, {saved})"] = acts * batch
    # AdamW's step runs after the backward has freed its activations and gather buffers;
    # the foreach kernel's float32 scratch (√v̂ + ε of every trained parameter at once) is
    # counted where it outgrows them (learner/optimizer.py)
    if adamw_kernel(cfg.optim, m.device) == "foreach":
        transient = ("FSDP", "activations", "autocast cache")
        backward = sum(v for k, v in parts.items() if k.startswith(transient))
        excess = 4 * trainable // ranks - backward
        if excess > 0:
            parts[f"AdamW foreach scratch (float32{shard}) beyond the backward's"] = excess
    return ActorPlan(
        actor="learner rank", count=t.learner.count, gpus=t.learner.num_gpus, parts=parts
    )


def reward_scorer_names(cfg: G2RPOConfig) -> list[str]:
    named = [s.split("=", 1)[0] for s in cfg.train.reward.scorers]
    return named or [r.name for r in cfg.rewards]


def reward_replica(cfg: G2RPOConfig) -> ActorPlan:
    r = cfg.train.reward
    parts = {}
    for name in reward_scorer_names(cfg):
        params = SCORER_PARAMS.get(name, 0)
        if params:
            parts[f"{name} weights (bfloat16)"] = int(params * 2)
    if parts:
        parts[f"scoring batch ({SCORING_BATCH} images)"] = SCORING_BATCH * SCORER_IMAGE_BYTES
    return ActorPlan(
        actor="reward replica",
        count=r.job_replicas(),
        gpus=r.num_gpus,
        parts=parts,
        on_gpu=r.num_gpus > 0,
    )


def gpus_asked(cfg: G2RPOConfig) -> float:
    """What the config asks Ray for, in GPUs (compare a recipe's header with it); each
    rank of a learner group reserves whole GPUs (its placement bundle), and a colocated
    pair one GPU (theirs)."""
    t = cfg.train
    # a colocated worker takes its share of its rank's bundle, not GPUs of its own
    workers = 0.0 if t.placement == "colocated" else t.workers.count * t.workers.num_gpus
    return (
        workers
        + t.learner.count * t.bundle_gpus()
        + (t.eval.num_gpus if t.eval.on_actor else 0.0)
        # replicas in the pairs (train.reward.in_pairs) take shares of the pairs' GPUs
        + (0.0 if t.reward.in_pairs else t.reward.job_replicas() * t.reward.num_gpus)
    )


@lru_cache(maxsize=256)
def _plan_cached(text: str, gpu_memory: int) -> Plan:
    cfg = G2RPOConfig.model_validate_json(text)
    return _plan(cfg, gpu_memory)


def plan(cfg: G2RPOConfig, gpu_memory_gib: float | None = None) -> Plan:
    """Every actor kind's estimate and verdict against ``gpu_memory_gib`` (default
    ``train.memory.gpu_memory_gib``) of GPU memory."""
    gib = cfg.train.memory.gpu_memory_gib if gpu_memory_gib is None else gpu_memory_gib
    return _plan_cached(cfg.model_dump_json(), int(gib * GiB))


def _plan(cfg: G2RPOConfig, gpu_memory: int) -> Plan:
    archs, where = architecture(cfg)
    actors = [rollout_worker(cfg, archs), learner_rank(cfg, archs)]
    if cfg.train.eval.on_actor:
        actors.append(evaluator(cfg, archs))
    if cfg.train.reward.job_replicas() > 0:
        actors.append(reward_replica(cfg))
    on_gpu = cfg.model.device.startswith("cuda")
    for a in actors:
        if a.actor != "reward replica":
            a.on_gpu = on_gpu
        a.budget = _gb_budget(cfg, a.gpus, gpu_memory)
    if cfg.train.placement == "colocated":
        from .pairs import take_turns

        replica = next((a for a in actors if a.actor == "reward replica"), None)
        in_pairs = replica if cfg.train.reward.in_pairs and replica and replica.on_gpu else None
        o = cfg.train.offload
        take_turns(actors[0], actors[1], gpu_memory, in_pairs, o.learner, o.worker)
    return Plan(
        actors=actors, gpus_asked=gpus_asked(cfg), gpu_memory=gpu_memory, architecture=where
    )
