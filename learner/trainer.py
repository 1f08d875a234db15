"""The learner's job, without Ray: fuse advantages over a whole iteration's
trajectories, run the GRPO update, version and checksum the weights, checkpoint."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from ..common.algorithms.sde import noise_step_weights
from ..common.algorithms.seeds import seed_for
from ..common.cluster.time_sharing import (
    HOST,
    LEARNER_PARTS,
    DeviceTurn,
    HostMirror,
    move_module,
    move_optimizer_state,
    synchronize,
)
from ..common.config.algorithm import FORWARD_PROCESS
from ..common.config.run import G2RPOConfig
from ..common.errors import ConfigError
from ..common.families.flux_pipeline import latent_size
from ..common.families.loaders import resolve_local_dir
from ..common.families.lora import BaseModelVelocity, adapter_state, attach_lora
from ..common.families.registry import config_sampling_grid, family_class
from ..common.families.transformer_call import checkpointing_func
from ..common.paths import resolve_path
from ..common.wire.trajectories import Trajectories
from ..common.wire.weights import weights_checksum
from .advantages import plan_advantages
from .checkpoints import full_weights, load_full_weights
from .core_state import SavedState
from .distributed import SINGLE, RankShare, shard_transformer
from .forward_process import ForwardProcess
from .grpo import StepSpec
from .objective import LearnerParts, Objective
from .optimizer import adamw
from .policy_gradient import PolicyGradient


def trained_state(
    transformer: torch.nn.Module, lora: bool, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """What changes in training, on the CPU: the adapters of a LoRA run, else every
    weight (what the learner publishes and checkpoints); floating-point tensors in
    ``dtype`` when given. One copy per tensor (the learner goes on training in place):
    device to host, cast included (a bfloat16 copy moves half the bytes)."""
    if lora:
        return in_rollout_dtype(adapter_state(transformer), dtype or torch.float32)
    return {
        k: v.detach().to(
            device="cpu", dtype=dtype if dtype and v.is_floating_point() else None, copy=True
        )
        for k, v in transformer.state_dict().items()
    }


def in_rollout_dtype(state: dict[str, torch.Tensor], dtype: torch.dtype):
    """``state`` as the rollout workers hold it (``model.rollout_weights_dtype``):
    they never train, so bfloat16 halves the bytes on the wire."""
    if dtype == torch.float32:
        return state
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


class StaleTrajectories(RuntimeError):
    """Trajectories sampled with weights older than the staleness bound allows."""


def uses_process_group(cfg: G2RPOConfig) -> bool:
    """Learners form a torch.distributed group: several of them, or one whose
    transformer FSDP2 computes in mixed precision."""
    return cfg.train.learner.count > 1 or cfg.model.mixed_precision == "fsdp"


def sharded_learner(cfg: G2RPOConfig) -> bool:
    """FSDP2 shards the transformer: a full fine-tune in a process group (a LoRA
    group keeps data-parallel replicas)."""
    return cfg.model.lora is None and uses_process_group(cfg)


def learner_share(cfg: G2RPOConfig, rank: int) -> RankShare:
    """Rank ``rank``'s part of the group: FSDP2 shards for a full fine-tune in a
    group, data-parallel replicas for LoRA, the whole update for one learner."""
    return RankShare(rank, cfg.train.learner.count, sharded=sharded_learner(cfg))


def single_rank(cfg: G2RPOConfig) -> G2RPOConfig:
    """``cfg`` for one learner: it holds what ``train.learner.count`` ranks would share."""
    learner = cfg.train.learner.model_copy(update={"count": 1})
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"learner": learner})})


def pretrained_dir(cfg: G2RPOConfig) -> Path:
    """The local pipeline directory a learner trains from (``model.pretrained``)."""
    cfg.model.check_trainable()
    if cfg.model.pretrained is None:
        raise ConfigError("model.pretrained: a local pipeline directory is needed for training")
    return resolve_local_dir(
        resolve_path(cfg.model.pretrained), "model.pretrained", required=("model_index.json",)
    )


def read_transformer(cfg: G2RPOConfig, share: RankShare = SINGLE) -> torch.nn.Module:
    """Rank ``share.rank``'s pretrained transformer, read without a process group: in
    a sharded group only rank 0 reads the weights (on the CPU) and the other ranks
    build it on the meta device, getting their shards from rank 0 once it is sharded
    (one full copy in the group's host memory, rank 0's, and none on a device);
    otherwise the whole transformer on ``model.device``. A learner actor calls it
    before its group forms (``Learner.prepare``): the ranks that wait for rank 0's
    read wait in Ray, not in the group's first collective."""
    m = cfg.model
    path = pretrained_dir(cfg)
    model_class = family_class(cfg).transformer_class()
    torch.set_num_threads(cfg.train.threads)  # the read upcasts on the CPU
    if share.sharded and share.rank != 0:
        config = model_class.load_config(path, subfolder="transformer", local_files_only=True)
        with torch.device("meta"):
            return model_class.from_config(config)
    transformer = model_class.from_pretrained(
        path, subfolder="transformer", local_files_only=True, torch_dtype=m.base_weights_dtype()
    )
    return transformer.to("cpu" if share.sharded else m.device)


@contextmanager
def learner_outside_ray(cfg: G2RPOConfig):
    """A one-rank learner in this process, built as training builds a group's rank 0
    (``g2rpo doctor``, ``bench precision``): when the config computes through a process
    group (FSDP mixed precision) it joins a group of its own and leaves it after."""
    from ..common.cluster.net import free_port
    from ..common.cluster.timeouts import collective_timeout_s
    from .distributed import join_learner_group, leave_learner_group

    cfg = single_rank(cfg)
    joined = uses_process_group(cfg)
    if joined:
        address = f"127.0.0.1:{free_port()}"
        join_learner_group(address, 0, 1, cfg.model.device, collective_timeout_s(cfg))
    try:
        yield LearnerCore(cfg, learner_share(cfg, 0))
    finally:
        if joined:
            leave_learner_group()


class LearnerCore(SavedState):
    """The learner's state and update. In a learner group each rank holds one core
    (its process already joined the group); every method that gathers or reduces
    must then be called on every rank, and rank 0's answer is the group's.
    ``transformer``: this rank's ``read_transformer(cfg, share)``, when it was read
    before the group formed; otherwise the core reads it."""

    def __init__(
        self,
        cfg: G2RPOConfig,
        share: RankShare = SINGLE,
        transformer: torch.nn.Module | None = None,
    ) -> None:
        from diffusers import AutoencoderKL

        torch.set_num_threads(cfg.train.threads)
        self.cfg, self.share = cfg, share
        path = pretrained_dir(cfg)
        self.sharded = share.sharded
        # FSDP2 gathers parameters and casts each block's inputs in model.dtype
        self.fsdp_mixed_precision = self.sharded and cfg.model.mixed_precision == "fsdp"
        self.transformer = transformer if transformer is not None else read_transformer(cfg, share)
        self.lora = cfg.model.lora is not None
        attach_lora(self.transformer, cfg)
        if cfg.model.gradient_checkpointing:
            # recompute each block's activations in the backward (same gradients)
            fsdp_dtype = cfg.model.autocast_dtype() if self.fsdp_mixed_precision else None
            self.transformer.enable_gradient_checkpointing(
                checkpointing_func(cfg.model.attention_backend, fsdp_dtype)
            )
        self.transformer.train()
        vae_config = AutoencoderKL.load_config(path, subfolder="vae", local_files_only=True)
        self.side, _ = latent_size(vae_config, cfg.train.image_size, cfg.train.image_size)
        self.velocity = self._velocity_of(self.transformer)
        a = cfg.algorithm
        betas = {"flowgrpo": a.flowgrpo.kl_beta, "nft": a.nft.kl_beta, "awm": a.awm.kl_beta}
        self.kl_beta = betas.get(a.name, 0.0)
        self.reference = self._reference_model() if self.kl_beta > 0 else None
        if self.sharded:
            self._shard()
        self.trainable = [p for p in self.transformer.parameters() if p.requires_grad]
        # DiffusionNFT's and AWM's objective keeps an old copy of the trained weights
        self.objective: Objective = (
            ForwardProcess(self.trainable)
            if cfg.algorithm.name in FORWARD_PROCESS
            else PolicyGradient()
        )
        o = cfg.optim
        self.optimizer = adamw(self.trainable, o, cfg.model.device)
        sde_type = cfg.sde_type()
        grid = config_sampling_grid(cfg)
        step_weights = None
        if cfg.algorithm.name == "tempflow" and cfg.algorithm.tempflow.step_weights == "noise":
            step_weights = noise_step_weights(
                grid.sigmas, cfg.sampling.sde_steps, cfg.sampling.eta, sde_type, grid.sigma_1
            )
        self.spec = StepSpec(
            grid=grid,
            eta=cfg.sampling.eta,
            sde_type=sde_type,
            step_weights=step_weights,
            ratio_norm=cfg.optim.loss == "grpo_guard",
            cps_flow_grpo=cfg.optim.cps_ratio == "flow_grpo",
        )
        self.version = 0
        self.iteration = 0
        # offload(): what train.offload.learner keeps on the host while the rollout has
        # the GPU, in host buffers allocated at the first offload and reused after
        self.mirror = HostMirror(cfg.model.device)
        self.turn = DeviceTurn(
            cfg.model.device, self._move_to, LEARNER_PARTS[cfg.train.offload.learner]
        )

    def _shard(self) -> None:
        """FSDP2 over the policy (and the KL reference): shard, then fill the shards
        from rank 0's weights."""
        m = self.cfg.model
        compute = m.autocast_dtype() if self.fsdp_mixed_precision else None
        initial = dict(self.transformer.state_dict()) if self.share.rank == 0 else {}
        modules = [self.transformer]
        if self.reference is not None:  # a copy of the unsharded initial model
            modules.append(self.reference.transformer)
        for module in modules:
            shard_transformer(module, m.device, compute)
            load_full_weights(module, dict(initial))

    def _velocity_of(self, transformer):
        """The family's velocity adapter over ``transformer`` (FLUX: FluxVelocity)."""
        m = self.cfg.model
        # FSDP2's mixed-precision policy casts parameters and inputs: no autocast then
        autocast = None if m.mixed_precision == "fsdp" else m.autocast_dtype()
        return family_class(self.cfg).velocity(
            transformer, (self.side, self.side), m.guidance, autocast, m.attention_backend
        )

    def _reference_model(self):
        """The KL reference (Flow-GRPO): the base model. With LoRA that is the same
        transformer with its adapters off; otherwise a frozen copy of the initial one."""
        if self.lora:
            return BaseModelVelocity(self.velocity)
        import copy

        return self._velocity_of(copy.deepcopy(self.transformer).eval().requires_grad_(False))

    def _held_modules(self) -> list[torch.nn.Module]:
        """The modules whose weights this core keeps: the trained transformer and a full
        fine-tune's frozen KL reference (a LoRA reference is the same transformer)."""
        modules = [self.transformer]
        if self.reference is not None and not self.lora:
            modules.append(self.reference.transformer)
        return modules

    def _move_to(self, device: torch.device, parts: tuple[str, ...] = ("optimizer", "weights")):
        """``parts`` to the host (``device`` is ``HOST``) or back onto ``device``: the
        optimizer's moments (``optimizer``); the held modules' parameters, gradients and
        buffers and an objective's own copy (``weights``). Returns once they are there."""
        target = None if device == HOST else device
        if "weights" in parts:
            prefixes = ("", "reference.")  # the trained transformer, a KL reference's copy
            for prefix, module in zip(prefixes, self._held_modules(), strict=False):
                move_module(module, self.mirror, target, prefix)  # FSDP2's shards too
            self.objective.to(device)
        if "optimizer" in parts:
            names = {id(p): n for n, p in self.transformer.named_parameters()}
            move_optimizer_state(self.optimizer, self.mirror, target, names)
        synchronize(self.turn.device)  # the copies were issued non_blocking

    def offload(self, parts: tuple[str, ...] | None = None) -> float:
        """Colocated time-sharing (``train.placement``): what ``train.offload.learner``
        sends to the host (all: weights, gradients, optimizer moments, the KL reference, an
        objective's own copy; optimizer: the moments; none: nothing) moves there (of
        ``parts``, when given) and the device's cached blocks are freed, so the rollout
        worker beside it has the GPU; the next call that computes brings it back. Its
        seconds (0 when there was nothing to move); the turn's total is kept for the next
        update's row."""
        return self.turn.offload(parts)

    def resident(self, parts: tuple[str, ...] | None = None) -> float:
        """Back on ``model.device`` after ``offload`` (of ``parts``, when given; a no-op
        otherwise): called by every method that computes or gathers. Its seconds."""
        return self.turn.resident(parts)

    def trained_state(self) -> dict[str, torch.Tensor]:
        """What the learner publishes and checkpoints; in an FSDP group every rank
        must call (the weights are gathered) and only rank 0 gets them."""
        self.resident()
        if self.sharded:
            return full_weights(self.transformer)
        return trained_state(self.transformer, self.lora)

    def weights(self) -> tuple[int, dict[str, torch.Tensor], str] | None:
        """(version, state, checksum) of the weights rollout workers load, in
        ``model.rollout_weights_dtype``; None on ranks other than 0 (which copy
        nothing unless the weights are sharded, where every rank gathers). Only the
        weights come back to the device for it (a restarted worker's version is gathered
        again beside the other workers' rollouts; the moments stay on the host)."""
        self.resident(("weights",))
        dtype = getattr(torch, self.cfg.model.rollout_weights_dtype)
        if self.sharded:
            # each rank casts its shards on its device, then they are gathered
            state = full_weights(self.transformer, dtype)
            if self.share.rank != 0:
                return None
        elif self.share.rank != 0:
            return None
        else:
            state = trained_state(self.transformer, self.lora, dtype)
        return self.version, state, weights_checksum(state)

    def update(self, batches: list[Trajectories]) -> dict:
        onload_s = self.resident()
        bound = self.cfg.train.weights.staleness
        for b in batches:
            if self.version - b.version > bound:
                raise StaleTrajectories(
                    f"worker {b.worker} sampled iteration {b.iteration} with weights v{b.version}; "
                    f"the learner is at v{self.version} and accepts lag <= {bound}"
                )
        # versions between the weights that sampled a batch and those it updates
        lag = max(self.version - b.version for b in batches)
        weights = self.cfg.reward_weights()
        control = torch.Generator().manual_seed(seed_for(self.cfg.run.seed, self.iteration, 0, 1))
        advs = [
            plan_advantages(b.plan, {n: b.leaf_rewards[n] for n in weights}, self.cfg, control)
            for b in batches
        ]
        parts = LearnerParts(
            cfg=self.cfg,
            velocity=self.velocity,
            trainable=self.trainable,
            optimizer=self.optimizer,
            spec=self.spec,
            reference=self.reference,
            kl_beta=self.kl_beta,
            share=self.share,
            iteration=self.iteration,
        )
        stats = self.objective.update(parts, batches, torch.cat(advs), lag)
        self.version += 1
        self.iteration += 1
        if self.cfg.train.placement == "colocated":  # this iteration's two moves
            stats["time/learner_offload_s"] = self.turn.offload_s
            stats["time/learner_onload_s"] = onload_s
        return stats
