"""What `g2rpo rehearse` runs: the recipe as `g2rpo train` runs it, with three stated
changes so it fits one CPU machine, and every per-request and per-object size kept.

1. **Models**: random ones of the recipe's latent geometry, shrunk in width and depth.
   The transformer keeps its input channels, patching and guidance embedding (so the
   packed latent of a 720² image is the same 2,025 tokens × 64 channels, and the text
   sequence the same ``train.max_sequence_length`` tokens), 8 channels wide and no
   transformer block (one double-stream block for a LoRA run, whose adapters need its
   attention projections): at 2,537 tokens a block's attention alone is most of a CPU's
   time, and what a rehearsal checks is the data, not the attention. The VAE keeps its
   latent channels, scale factor (its number of blocks) and scaling/shift, so it decodes
   the same images, one channel wide (a 720² decode is still ~0.17 CPU-s: most of a
   rehearsal's time). The text encoders are the committed tiny world's. Reward models
   are random CLIPs at the scorers' input resolution (224²), a few channels wide.
2. **Numbers**: computed in float32 on the CPU (bfloat16 is emulated on CPUs without
   AVX512-BF16), so ``model.dtype``, ``rollout_weights_dtype`` and FSDP's mixed
   precision fall back to float32; one torch thread per actor; the VAE decodes one image
   at a time (``sampling.decode_batch``, a GPU memory setting: on a CPU a 720² decode of
   one image is 3× faster per image than of four, which no longer fit its caches).
3. **Counts**: at most ``MAX_ACTORS`` rollout workers, learner ranks and reward
   replicas each (a group stays a group); the evaluator as the recipe says. Everything
   per actor is the recipe's: prompts and leaves per worker, image size, sampling
   batches, evaluation samples, request limits, GPUs asked of Ray (the nodes declare
   GPUs they do not have), placement strategy, weight transport, checkpoint layout.

The run goes to ``ROOT/runs`` and its models and prompts to ``ROOT/shared``, which
every node sees (a cluster's model and prompt volumes); the run directory is shared
too unless the rehearsal is asked to show what happens when it is not."""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..common.config.run import G2RPOConfig
from ..common.errors import UsageError
from ..common.paths import DEFAULT_WORLD
from ..reward_server.replicas import scorer_specs

MAX_ACTORS = 2
# scorers that load a converted CLIP directory: replaced by a random one
CLIP_SCORERS = ("clip_score", "pickscore", "hpsv2")
NEED_NO_DIR = ("jpeg_compressibility", "shapes_oracle", "shapes_strict", "shapes_clip")
WIDTH = {"head_dim": 8, "rope": [2, 2, 4], "vae_channels": 1}


@dataclass(frozen=True)
class NodeSpec:
    name: str
    num_cpus: int
    num_gpus: int
    resources: dict[str, float]


@dataclass(frozen=True)
class Rehearsal:
    overrides: list[str]  # applied to the recipe, in order
    rule: list[str]  # what changed, said for the report
    nodes: list[NodeSpec]
    scorers: dict[str, str]  # scorer name -> its random model's kind ("clip"), or ""


def rehearsal_of(
    cfg: G2RPOConfig, root: Path, nodes: int, iterations: int, shared_run_dir: bool = True
) -> Rehearsal:
    """The overrides that turn recipe ``cfg`` into its rehearsal under ``root`` on
    ``nodes`` worker nodes, ``iterations`` iterations in all (pure: nothing built)."""
    if nodes < 1:
        raise UsageError(f"--nodes {nodes}: at least one worker node")
    if iterations < 2:
        raise UsageError(f"--iterations {iterations}: at least 2 (one before the resume)")
    t, shared = cfg.train, root / "shared"
    workers = min(t.workers.count, MAX_ACTORS)
    learners = min(t.learner.count, MAX_ACTORS)
    replicas = max(1, min(t.reward.job_replicas(), MAX_ACTORS))
    over = [
        f"model.pretrained={shared / 'models' / 'pipeline'}",
        "model.device=cpu",
        "model.dtype=float32",
        "model.rollout_weights_dtype=float32",
        "model.mixed_precision=autocast",
        "train.threads=1",
        "sampling.decode_batch=1",
        f"train.workers.count={workers}",
        f"train.learner.count={learners}",
        f"train.reward.replicas={replicas}",
        "train.reward.urls=[]",
        "train.reward.redis_url=null",
        "train.reward.token_env=null",
        f"run.output_dir={root / 'runs'}",
        f"run.iterations={iterations}",
        "train.checkpoints.every=1",
        "train.metrics.port=null",
    ]
    kinds, specs = {}, []
    for name in scorer_specs(cfg):
        if name in (*CLIP_SCORERS, "image_reward"):
            kinds[name] = "clip" if name in CLIP_SCORERS else name
            specs.append(f"{name}={shared / 'models' / 'rewards' / name}")
        elif name in NEED_NO_DIR:
            kinds[name] = ""
            specs.append(name)
        else:
            known = ", ".join((*CLIP_SCORERS, "image_reward", *NEED_NO_DIR))
            raise UsageError(f"rehearse: no random stand-in for scorer {name!r} (known: {known})")
    over.append(f"train.reward.scorers=[{', '.join(specs)}]")
    if not Path(t.prompts).is_file() and not t.prompts.startswith("shapes:"):
        over.append(f"train.prompts={shared / 'data' / 'train_prompts.txt'}")
    if not Path(t.eval.prompts).is_file() and not t.eval.prompts.startswith("shapes:"):
        over.append(f"train.eval.prompts={shared / 'data' / 'eval_prompts.txt'}")
    blocks = "one double-stream block (LoRA)" if cfg.model.lora else "no transformer block"
    rule = [
        f"models: random, the recipe's latent geometry, {WIDTH['head_dim']} channels wide, "
        f"{blocks}, a {WIDTH['vae_channels']}-channel VAE of the same scale factor; random "
        "224² CLIP and ImageReward scorers",
        "numbers: float32 on the CPU, one thread per actor, one image per VAE decode",
        f"counts: rollout workers {t.workers.count} -> {workers}, learner ranks "
        f"{t.learner.count} -> {learners}, reward replicas {t.reward.job_replicas()} -> "
        f"{replicas} (at most {MAX_ACTORS} each); per-actor sizes are the recipe's",
        f"run: {iterations} iterations, a checkpoint after each; run.output_dir "
        + ("shared by every node" if shared_run_dir else "private to each node"),
    ]
    layout = node_layout(cfg, workers, learners, replicas, nodes)
    return Rehearsal(over, rule, layout, kinds)


def node_layout(
    cfg: G2RPOConfig, workers: int, learners: int, replicas: int, nodes: int
) -> list[NodeSpec]:
    """Worker nodes that hold the scaled actors as the recipe asks Ray: the GPUs asked
    spread over ``nodes``, one node able to hold the whole learner group (its
    STRICT_PACK bundles), CPUs and custom resources enough on each for any actor."""
    t = cfg.train
    # a colocated worker's GPU share lies in its rank's bundle (train.bundle_gpus)
    worker_gpus = 0.0 if t.placement == "colocated" else t.workers.num_gpus
    counted = [
        (workers, t.workers.num_cpus, worker_gpus, t.workers.resources),
        (learners, t.learner.num_cpus, t.bundle_gpus(), t.learner.resources),
        (int(t.eval.on_actor), t.eval.num_cpus, t.eval.num_gpus, t.eval.resources),
        (replicas, t.reward.num_cpus, t.reward.num_gpus, t.reward.resources),
    ]
    gpus = sum(n * g for n, _, g, _ in counted)
    group = learners * t.bundle_gpus() if learners > 1 else 0
    per_node = max(math.ceil(gpus / nodes - 1e-9), math.ceil(group))
    cpus = max(2, math.ceil(sum(n * c for n, c, _, _ in counted)))
    custom: dict[str, float] = {}
    for n, _, _, resources in counted:
        for name, amount in resources.items():
            custom[name] = custom.get(name, 0.0) + n * amount
    custom = {name: float(math.ceil(v)) for name, v in custom.items()}
    return [NodeSpec(f"node-{k + 1}", cpus, per_node, custom) for k in range(nodes)]


def build_models(cfg: G2RPOConfig, root: Path, kinds: dict[str, str], seed: int = 0) -> None:
    """The random pipeline and reward models under ``root/shared/models``."""
    from ..planning.estimate import architecture

    archs, _ = architecture(cfg)  # the recipe's (its preset when its weights are elsewhere)
    blocks = 1 if cfg.model.lora is not None else 0
    rehearsal_pipeline(root / "shared" / "models" / "pipeline", archs, blocks, seed)
    from ..reward_server.random_models import random_clip_dir, random_image_reward_dir

    for name, kind in kinds.items():
        where = root / "shared" / "models" / "rewards" / name
        if kind == "clip":
            random_clip_dir(where, "rehearsal", seed)
        elif kind == "image_reward":
            random_image_reward_dir(where, seed)


def rehearsal_pipeline(out: Path, archs: dict[str, dict], blocks: int = 0, seed: int = 0) -> Path:
    """A pipeline directory of the recipe's family and latent geometry, shrunk (module
    doc), with ``blocks`` double-stream (FLUX) or MMDiT (SD3, Qwen-Image) transformer
    blocks."""
    import json

    import torch

    from ..planning.presets import build_component, transformer_family

    world = DEFAULT_WORLD / "pipeline"
    vae = archs["vae"]
    if transformer_family(archs["transformer"]) == "qwenimage":
        from ..planning.random_pipeline import text_stack_qwenimage_pipeline

        vae = {  # the same temporal_downsample (scale factor) and 16 latent channels
            **vae,
            "base_dim": max(WIDTH["vae_channels"], 4),  # its RMS norms need a few channels
            "dim_mult": [1] * len(vae["dim_mult"]),
            "num_res_blocks": 0,
        }
        transformer = {  # Qwen-Image's packing and channels; one head of 8
            **archs["transformer"],
            "num_layers": blocks,
            "num_attention_heads": 1,
            "attention_head_dim": WIDTH["head_dim"],
            "axes_dims_rope": WIDTH["rope"],
        }
        return text_stack_qwenimage_pipeline(out, transformer, vae, seed)
    vae_blocks = len(vae["block_out_channels"])  # the scale factor: 2 ** (blocks - 1)
    vae = {
        **vae,
        "block_out_channels": [WIDTH["vae_channels"]] * vae_blocks,
        "layers_per_block": 0,
        "norm_num_groups": 1,
        "mid_block_add_attention": False,
    }
    if transformer_family(archs["transformer"]) == "sd3":
        from ..planning.random_pipeline import text_stack_sd3_pipeline

        transformer = {  # SD3's patching, channels and positional table; one head of 8
            **archs["transformer"],
            "num_layers": blocks,
            "num_attention_heads": 1,
            "attention_head_dim": WIDTH["head_dim"],
            "caption_projection_dim": WIDTH["head_dim"],
            "dual_attention_layers": [],
        }
        return text_stack_sd3_pipeline(out, transformer, vae, seed)
    text = json.loads((world / "text_encoder" / "config.json").read_text())
    t5 = json.loads((world / "text_encoder_2" / "config.json").read_text())
    transformer = {
        **archs["transformer"],
        "num_layers": blocks,
        "num_single_layers": 0,
        "num_attention_heads": 1,
        "attention_head_dim": WIDTH["head_dim"],
        "axes_dims_rope": WIDTH["rope"],
        "joint_attention_dim": t5["d_model"],
        "pooled_projection_dim": text["hidden_size"],
    }
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(world / "model_index.json", out / "model_index.json")
    for sub in ("scheduler", "tokenizer", "tokenizer_2", "text_encoder", "text_encoder_2"):
        shutil.copytree(world / sub, out / sub, dirs_exist_ok=True)
    torch.manual_seed(seed)
    for name, config in (("transformer", transformer), ("vae", vae)):
        build_component(name, config).save_pretrained(out / name)
    return out


def write_prompts(cfg: G2RPOConfig, root: Path) -> None:
    """Prompt files where the recipe's are not here: the shapes world's prompts, as
    many as the recipe reads (its evaluation's samples are its request sizes)."""
    from ..common.prompts.shapes import all_combinations

    prompts = [s.prompt for s in all_combinations()]
    data = root / "shared" / "data"
    data.mkdir(parents=True, exist_ok=True)
    need = {"train_prompts.txt": len(prompts), "eval_prompts.txt": cfg.train.eval.samples}
    for name, count in need.items():
        lines = [prompts[i % len(prompts)] for i in range(max(count, 1))]
        (data / name).write_text("\n".join(lines) + "\n")
