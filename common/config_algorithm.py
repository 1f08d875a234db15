"""The ``algorithm`` section (which method a run trains with, and each method's own
options) and the ``optim`` section (how the learner optimises: rates, clips, the loss,
when it steps)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from .config_train import Section

AlgorithmName = Literal[
    "g2rpo", "dancegrpo", "flowgrpo", "mixgrpo", "flowgrpo_fast", "tempflow", "branchgrpo"
]
ALGORITHMS: tuple[str, ...] = get_args(AlgorithmName)


class DanceGRPOOptions(Section):
    timestep_fraction: float = Field(0.6, gt=0, le=1, description="fraction of steps trained")


class FlowGRPOOptions(Section):
    train_fraction: float = Field(0.99, gt=0, le=1, description="first int(T·f) steps trained")
    kl_beta: float = Field(0.0, ge=0, description="KL to the initial model")
    init_same_noise: bool = False
    adv_std: Literal["group", "global"] = "group"


class MixGRPOOptions(Section):
    window_size: int = Field(4, ge=1)
    shift_every: int = Field(25, ge=1, description="iterations per window position")
    stride: int = Field(1, ge=0, description="window advance per move")
    roll_back: bool = True


class FlowGRPOFastOptions(Section):
    """Flow-GRPO-Fast as its original code samples: one ODE trunk per prompt, G branches
    at a random step k, SDE for ``window`` steps from k, ODE to the end; only the window's
    steps are trained, each with its leaf's advantage."""

    window: int = Field(2, ge=1, description="consecutive SDE (trained) steps from the branch step")
    branch_max: int | None = Field(
        None,
        ge=0,
        description="k is drawn uniformly from 0..branch_max per prompt and iteration "
        "(default T//2, the original code's range)",
    )


class TempFlowOptions(Section):
    """TempFlow-GRPO: G²RPO's tree with one granularity (full ODE completion), branches
    at ``sampling.sde_steps`` (the official code: every step 0..T−2), and each trained
    step's PPO terms weighted by its noise level τ_k / mean of τ over the trained steps."""

    step_weights: Literal["noise", "uniform"] = Field(
        "noise", description="noise: w_k = τ_k / mean τ (the paper's noise-aware weighting)"
    )


class BranchGRPOOptions(Section):
    """BranchGRPO: a binary tree per prompt, SDE (DanceGRPO's, g = η) on every edge,
    splitting at these steps; sampling.group_size must be 2^len(split_steps)."""

    split_steps: list[int] = Field(
        default_factory=lambda: [0, 3, 6, 9], description="steps where every node splits in two"
    )


class AlgorithmConfig(Section):
    name: AlgorithmName = "g2rpo"
    dancegrpo: DanceGRPOOptions = Field(default_factory=DanceGRPOOptions)
    flowgrpo: FlowGRPOOptions = Field(default_factory=FlowGRPOOptions)
    mixgrpo: MixGRPOOptions = Field(default_factory=MixGRPOOptions)
    flowgrpo_fast: FlowGRPOFastOptions = Field(default_factory=FlowGRPOFastOptions)
    tempflow: TempFlowOptions = Field(default_factory=TempFlowOptions)
    branchgrpo: BranchGRPOOptions = Field(default_factory=BranchGRPOOptions)
    control: bool = Field(False, description="shuffle advantages within each group (control run)")


class OptimConfig(Section):
    lr: float = Field(2e-6, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    clip_range: float = Field(1e-4, gt=0, description="PPO ratio clip ε")
    adv_clip: float = Field(5.0, gt=0, description="advantage clamp after fusion")
    max_grad_norm: float = Field(1.0, gt=0)
    step_mode: Literal["per_sde_step", "accumulate", "per_samples"] = Field(
        "per_sde_step",
        description="optimizer step after each SDE step, once per iteration, "
        "or every samples_per_step samples",
    )
    samples_per_step: int = Field(
        4, ge=1, description="per_samples: samples per optimizer step (all workers together)"
    )
    loss: Literal["ppo", "grpo_guard"] = Field(
        "ppo",
        description="grpo_guard: GRPO-Guard's normalised ratio (RatioNorm) and each step's "
        "loss over its |Δσ| (gradient reweighting), on any SDE method; its clip ranges are "
        "smaller (the official 2e-6 to 4e-6)",
    )
    adv_eps: float = Field(1e-8, gt=0)
    adv_spread_tol: float = Field(
        1e-7, ge=0, description="groups spreading less get zero advantage"
    )
