"""The ``algorithm`` section (which method a run trains with, and each method's own
options) and the ``optim`` section (how the learner optimises: rates, clips, the loss,
when it steps)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from .section import Section

AlgorithmName = Literal[
    "g2rpo",
    "dancegrpo",
    "flowgrpo",
    "mixgrpo",
    "flowgrpo_fast",
    "tempflow",
    "branchgrpo",
    "treegrpo",
    "nft",
    "awm",
]
# trained on clean samples by the forward process (learner/nft.py), not on log-probs
FORWARD_PROCESS = ("nft", "awm")
ALGORITHMS: tuple[str, ...] = get_args(AlgorithmName)


class G2RPOOptions(Section):
    """Which of ``sampling.sde_steps`` branch in an iteration. The paper branches at all
    of them; a cheaper schedule (issue 23's efficiency frontier) takes
    ``steps_per_iteration`` of them, drawn afresh each iteration (the same draw on every
    worker) or a window sliding along them as MixGRPO's does."""

    steps_per_iteration: int | None = Field(
        None, ge=1, description="SDE steps branched per iteration (default: all sde_steps)"
    )
    step_choice: Literal["sampled", "sliding"] = Field(
        "sampled",
        description="sampled: a uniform draw without replacement per iteration; sliding: "
        "consecutive sde_steps entries, one later every slide_every iterations, back to the "
        "first after the last",
    )
    slide_every: int = Field(25, ge=1, description="sliding: iterations per window position")


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
    prune_depths: list[int] = Field(
        default_factory=list,
        description="depth pruning (BranchGRPO-DepPru): edges into nodes at these depths (1 = "
        "the root's children, T = the leaves) are rolled out but not trained",
    )
    width_pruning: Literal["off", "branch_best", "extremes"] = Field(
        "off",
        description="width pruning of the edges after the last split (their width_pruning_mode): "
        "branch_best keeps the best width_pruning_ratio of each leaf's chain by advantage "
        "(mode 1), extremes the best and the worst halves of that share over the iteration "
        "(mode 2)",
    )
    width_pruning_ratio: float = Field(0.5, gt=0, le=1, description="the share kept")
    prune_until: float = Field(
        1.0,
        gt=0,
        le=1,
        description="depth and width pruning apply while iteration <= prune_until x "
        "run.iterations (their pruning_step_ratio)",
    )
    split_noise_scale: float = Field(
        4.0,
        gt=0,
        description="std multiplier of the split edges' noise (their tree_split_noise_scale); "
        "unlike their code, each such edge's log-prob is the density it was drawn from",
    )


class TreeGRPOOptions(Section):
    """TreeGRPO: an ODE trunk per prompt to step ``start``, ``depth`` consecutive binary
    SDE splits (Flow-GRPO's SDE), ODE completion; sampling.group_size must be 2^depth.
    Each edge is trained with the mean normalised advantage of the leaves below it."""

    depth: int = Field(4, ge=1, description="consecutive split steps (the window w)")
    start: int = Field(0, ge=0, description="the window's first step")
    slide_every: int = Field(
        50, ge=0, description="the window moves one step later every N iterations (0: fixed)"
    )


class NFTOptions(Section):
    """DiffusionNFT: G ODE samples per prompt (own noises); the learner noises each clean
    sample at ``timesteps`` grid times and trains on the positive/negative implicit
    policies of v_θ and an old velocity (learner/nft.py)."""

    beta: float = Field(1.0, gt=0, description="the NFT mixing coefficient β (0.1 for OCR)")
    kl_beta: float = Field(1e-4, ge=0, description="weight of mean((v_θ − v_ref)²), the base")
    timesteps: int | None = Field(
        None, ge=1, description="grid times per sample (default T−1: the official 9 of 10)"
    )
    old_decay: Literal["linear_to_0_5", "delayed_linear_to_0_999", "copy"] = Field(
        "linear_to_0_5", description="λ of θ_old ← λ·θ_old + (1−λ)·θ after each update"
    )


class AWMOptions(Section):
    """AWM: G ODE samples per prompt; the learner weights the flow-matching loss of each
    clean sample, noised at one grid time per stratum, by its advantage (learner/nft.py)."""

    timesteps: int = Field(6, ge=1, description="strata of grid times, one draw each")
    strata_from: Literal["after_noise", "noise"] = Field(
        "after_noise",
        description="after_noise: strata over grid indices 1..T−3 (discrete_wo_init, "
        "GenEval/OCR); noise: from 0 (discrete, PickScore)",
    )
    power: float = Field(0.25, gt=0, le=1, description="the ghuber weighting's p")
    kl_beta: float = Field(1e-3, ge=0, description="weight of mean((v_θ − v_ref)²), the base")
    ema_kl: float = Field(1.0, ge=0, description="weight of mean((v_θ − v_ema)²)")
    ema_decay: Literal["linear_to_0_3", "linear_to_0_5", "copy"] = Field(
        "linear_to_0_3", description="λ of the EMA-KL copy: min(0.001·n, 0.3)"
    )


class AlgorithmConfig(Section):
    name: AlgorithmName = "g2rpo"
    g2rpo: G2RPOOptions = Field(default_factory=G2RPOOptions)
    dancegrpo: DanceGRPOOptions = Field(default_factory=DanceGRPOOptions)
    flowgrpo: FlowGRPOOptions = Field(default_factory=FlowGRPOOptions)
    mixgrpo: MixGRPOOptions = Field(default_factory=MixGRPOOptions)
    flowgrpo_fast: FlowGRPOFastOptions = Field(default_factory=FlowGRPOFastOptions)
    tempflow: TempFlowOptions = Field(default_factory=TempFlowOptions)
    branchgrpo: BranchGRPOOptions = Field(default_factory=BranchGRPOOptions)
    treegrpo: TreeGRPOOptions = Field(default_factory=TreeGRPOOptions)
    nft: NFTOptions = Field(default_factory=NFTOptions)
    awm: AWMOptions = Field(default_factory=AWMOptions)
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
    cps_ratio: Literal["gaussian", "flow_grpo"] = Field(
        "gaussian",
        description="with sampling.sde_type cps: the PPO ratio of CPS's Gaussian log-prob, or "
        "flow_grpo's (its log-prob drops the variance, log r' = 2τ²·log r; pair it with its "
        "clip range, 1e-5)",
    )
    implementation: Literal["auto", "fused", "foreach", "for_loop"] = Field(
        "auto",
        description="AdamW's kernels: auto is fused on CUDA (no float32 scratch the size of "
        "the trained weights in the step; foreach, torch's CUDA default, holds one) and "
        "for_loop elsewhere (torch's default on the CPU); the same update up to rounding",
    )
    adv_eps: float = Field(1e-8, gt=0)
    adv_spread_tol: float = Field(
        1e-7, ge=0, description="groups spreading less get zero advantage"
    )


def check_method(cfg) -> None:
    """Cross-field refusals of a method and its sampler and loss, each naming the fields
    (cfg: the whole G2RPOConfig; called by its validator)."""
    s, a = cfg.sampling, cfg.algorithm
    if cfg.sde_type() == "cps" and s.eta > 1:
        raise ValueError(
            f"sampling.eta {s.eta:g} with sampling.sde_type cps: CPS's noise is "
            "sigma'·sin(eta·pi/2), so eta must be <= 1 (flow_grpo's CPS recipes use 0.8)"
        )
    if cfg.optim.cps_ratio == "flow_grpo" and (cfg.sde_type() != "cps" or cfg.optim.loss != "ppo"):
        raise ValueError(
            "optim.cps_ratio flow_grpo is flow_grpo's ratio for CPS with PPO's loss: it "
            f"needs sampling.sde_type cps and optim.loss ppo (got {cfg.sde_type()}, "
            f"{cfg.optim.loss})"
        )
    per = a.g2rpo.steps_per_iteration
    # by value, not by what was set: a saved config lists every field
    default = G2RPOOptions()
    changed = sorted(
        k for k in G2RPOOptions.model_fields if getattr(a.g2rpo, k) != getattr(default, k)
    )
    if changed and a.name != "g2rpo":
        fields = ", ".join(f"algorithm.g2rpo.{k}" for k in changed)
        raise ValueError(f"{fields}: G²RPO's schedule, but algorithm.name is {a.name}")
    if per is None and changed:
        raise ValueError(
            "algorithm.g2rpo.step_choice and slide_every pick a subset of sampling.sde_steps: "
            "set algorithm.g2rpo.steps_per_iteration too (without it every step branches)"
        )
    if per is not None and per > len(s.sde_steps):
        raise ValueError(
            f"algorithm.g2rpo.steps_per_iteration {per} exceeds the {len(s.sde_steps)} steps "
            f"of sampling.sde_steps {s.sde_steps}"
        )
    if a.name == "tempflow" and s.granularities != [1]:
        raise ValueError(
            f"algorithm.name tempflow completes every branch on the full grid: set "
            f"sampling.granularities to [1] (got {s.granularities})"
        )
    if a.name == "branchgrpo":
        splits = a.branchgrpo.split_steps
        if len(set(splits)) != len(splits) or not all(0 <= k < s.num_steps for k in splits):
            raise ValueError(
                f"algorithm.branchgrpo.split_steps {splits} must be distinct steps in "
                f"[0, sampling.num_steps-1 = {s.num_steps - 1}]"
            )
        bad = [d for d in a.branchgrpo.prune_depths if not 1 <= d <= s.num_steps]
        if bad or len(set(a.branchgrpo.prune_depths)) >= s.num_steps:
            raise ValueError(
                f"algorithm.branchgrpo.prune_depths {a.branchgrpo.prune_depths}: depths are "
                f"1..sampling.num_steps = {s.num_steps}, and one at least must stay trained"
            )
        if cfg.sde_type() == "cps":
            raise ValueError(
                "algorithm.name branchgrpo trains every edge, the last into sigma=0 too, "
                "where CPS adds no noise: use sampling.sde_type auto, dance or flow"
            )
        if s.group_size != 2 ** len(splits):
            raise ValueError(
                f"sampling.group_size {s.group_size}: BranchGRPO's tree has "
                f"2^{len(splits)} = {2 ** len(splits)} leaves "
                f"(algorithm.branchgrpo.split_steps {splits})"
            )
    if a.name == "treegrpo":
        o = a.treegrpo
        if o.start + o.depth > s.num_steps - 1:
            raise ValueError(
                f"algorithm.treegrpo: start {o.start} + depth {o.depth} splits past step "
                f"sampling.num_steps-2 = {s.num_steps - 2} (the last step ends at sigma=0)"
            )
        if s.group_size != 2**o.depth:
            raise ValueError(
                f"sampling.group_size {s.group_size}: TreeGRPO's tree has 2^{o.depth} = "
                f"{2**o.depth} leaves (algorithm.treegrpo.depth {o.depth})"
            )
    if a.name in FORWARD_PROCESS:
        # a LoRA group's ranks are data-parallel replicas, each with the whole old copy;
        # FSDP2 shards would need the old copy sharded and swapped with them
        if cfg.model.mixed_precision == "fsdp":
            raise ValueError(
                f"algorithm.name {a.name} runs on unsharded learners for now: set "
                "model.mixed_precision to autocast"
            )
        if cfg.train.learner.count > 1 and cfg.model.lora is None:
            raise ValueError(
                f"algorithm.name {a.name} with train.learner.count "
                f"{cfg.train.learner.count} needs model.lora (a LoRA group's ranks are "
                "data-parallel replicas; a full fine-tune's would be FSDP2 shards, not yet "
                "supported here): set model.lora or train.learner.count 1"
            )
    if a.name == "awm":
        low = 1 if a.awm.strata_from == "after_noise" else 0
        if s.num_steps - 2 - low < a.awm.timesteps:
            raise ValueError(
                f"algorithm.awm.timesteps {a.awm.timesteps} strata need that many grid steps "
                f"in {low}..sampling.num_steps-3 (num_steps {s.num_steps})"
            )
        if a.nft.timesteps is not None and a.nft.timesteps > s.num_steps:
            raise ValueError(
                f"algorithm.nft.timesteps {a.nft.timesteps} > sampling.num_steps {s.num_steps}"
            )
    if a.name == "flowgrpo_fast":
        last = cfg.fast_branch_max() + a.flowgrpo_fast.window - 1
        if last > s.num_steps - 2:
            raise ValueError(
                f"algorithm.flowgrpo_fast: branch step up to {cfg.fast_branch_max()} plus "
                f"window {a.flowgrpo_fast.window} trains step {last}, past "
                f"sampling.num_steps-2 = {s.num_steps - 2} (the last step ends at sigma=0)"
            )
