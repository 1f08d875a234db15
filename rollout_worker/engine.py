"""The rollout engine: executes a RolloutPlan on a velocity model.

``batched`` mode walks the plan's tree as a wavefront: each tick makes ONE batched
model call (chunked by ``max_batch``) over every node whose state is known and
whose velocity some child needs, each sample at its own σ; every distinct
(prefix, σ) is evaluated once. ``reference`` mode replays the official loop: one
sample per model call, leaf by leaf, reusing only the states the official code
keeps. Both use the same noise tables and the same step function, so their
outputs agree to the model's batch-size rounding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from tqdm.auto import tqdm

from ..common.algorithms.rollout_plan import Edge, RolloutPlan
from ..common.algorithms.schedules import SamplingGrid
from ..common.algorithms.sde import gaussian_log_prob, step_coefficients, transition_mean
from ..common.wire.trajectories import Transitions

Execution = Literal["batched", "reference"]


class VelocityModel(Protocol):
    """v(x, σ) for a batch of latents, each sample at its own timestep.

    x: [B, ...] float32; timestep: [B] float32 (the network's input, e.g. floor(1000σ)/1000);
    cond: per-sample conditioning tensors, each with leading dim B. Returns [B, ...].
    """

    def __call__(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Mapping[str, torch.Tensor]
    ) -> torch.Tensor: ...


@dataclass
class RolloutResult:
    plan: RolloutPlan
    leaf_latents: torch.Tensor  # [num_leaves, ...] final (σ=0) latents in plan order
    transitions: Transitions
    nfe: int  # sample evaluations (a call over B samples counts B)
    model_calls: int

    def anchor_latents(self) -> torch.Tensor:
        """[P, ...]: the deterministic ODE sample of each prompt (the policy's eval sample)."""
        return self.plan.gather(self.leaf_latents, "anchor")


@dataclass
class _Record:
    state_key: object
    state: torch.Tensor
    step: int
    prompt: int
    next_sample: torch.Tensor
    next_step: int
    log_prob: torch.Tensor
    adv_slot: int
    mean: torch.Tensor | None = None  # μ_old, when the plan keeps means
    noise_scale: float = 1.0


class RolloutEngine:
    def __init__(
        self,
        model: VelocityModel,
        grid: SamplingGrid,
        *,
        max_batch: int = 256,
        progress: bool = False,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model = model
        self.sigmas = grid.sigmas.to(torch.float64).cpu()
        self.timesteps = grid.timesteps.to(torch.float32).cpu()
        self.max_batch = max_batch
        self.progress = progress
        self.total_nfe = 0
        self.total_model_calls = 0

    # ---------------------------------------------------------------- shared math
    def _velocity(
        self, x: torch.Tensor, steps: torch.Tensor, prompts: torch.Tensor, cond
    ) -> tuple[torch.Tensor, int]:
        """Model velocities for a batch, in chunks of max_batch; returns (v, calls)."""
        outs, calls = [], 0
        for lo in range(0, x.shape[0], self.max_batch):
            hi = min(lo + self.max_batch, x.shape[0])
            p = prompts[lo:hi]  # CPU bookkeeping; each gather runs where its tensor is
            chunk_cond = {name: c.index_select(0, p.to(c.device)) for name, c in cond.items()}
            t = self.timesteps.index_select(0, steps[lo:hi]).to(x.device)
            # a rollout never backpropagates: no autograd state, no autocast weight cache
            with torch.inference_mode():
                outs.append(self.model(x[lo:hi], t, chunk_cond).to(torch.float32))
            calls += 1
        # outside inference mode: the states built from v may reach a learner's autograd
        return torch.cat(outs), calls

    def _advance(
        self,
        plan: RolloutPlan,
        x: torch.Tensor,
        v: torch.Tensor,
        from_idx: torch.Tensor,
        edges: list[Edge],
        sde_noise: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Take each row's edge (ODE or SDE). Returns next states, per-row log-probs
        (NaN on deterministic rows) and the steps' means."""
        to_idx = torch.tensor([e.to for e in edges])
        noise_rows = torch.tensor([e.noise for e in edges])
        eta = (noise_rows >= 0).to(torch.float64) * plan.eta  # float64: η must not round
        coefs = step_coefficients(
            self.sigmas[from_idx], self.sigmas[to_idx], eta, plan.sde_type, float(self.sigmas[1])
        )
        scale = torch.tensor([e.noise_scale for e in edges], dtype=torch.float64)
        # a CPS step into σ=0 has no noise (τ = σ'·sin(ηπ/2)): deterministic, as the ODE
        stochastic = (noise_rows >= 0) & (coefs.std > 0)
        flat = torch.tensor([e.trained for e in edges]) & ~stochastic
        if bool(flat.any()):
            to = edges[int(flat.nonzero()[0])].to
            raise ValueError(
                f"a trained step to grid index {to} has no noise "
                "(sampling.eta 0, or CPS into sigma=0): it has no log-prob to train"
            )
        mean = transition_mean(x, v, coefs)
        sample = mean.clone()
        log_prob = torch.full((x.shape[0],), float("nan"), dtype=torch.float32, device=x.device)
        if bool(stochastic.any()):
            rows = torch.nonzero(stochastic).flatten()
            rows_dev = rows.to(x.device)
            eps = sde_noise.index_select(0, noise_rows[rows].to(sde_noise.device))
            eps = eps.to(x.device, torch.float32)
            std = coefs.std[rows] * scale[rows]  # drawn and scored with the same std
            drawn = (
                mean[rows_dev]
                + std.to(x.device, torch.float32).reshape(-1, *([1] * (x.ndim - 1))) * eps
            )
            sample[rows_dev] = drawn
            log_prob[rows_dev] = gaussian_log_prob(drawn, mean[rows_dev], std)
        return sample, log_prob, mean

    # ---------------------------------------------------------------- entry point
    @torch.no_grad()
    def run(
        self,
        plan: RolloutPlan,
        cond: Mapping[str, torch.Tensor],
        init_noise: torch.Tensor,
        sde_noise: torch.Tensor,
        execution: Execution = "batched",
    ) -> RolloutResult:
        """Execute ``plan``. cond: tensors with leading dim P (prompts); init_noise:
        [num_roots, ...]; sde_noise: [num_noises, ...] (rows are indexed by the plan)."""
        if init_noise.shape[0] != plan.num_roots:
            raise ValueError(
                f"init_noise has {init_noise.shape[0]} rows, the plan needs {plan.num_roots}"
            )
        if sde_noise.shape[0] < plan.num_noises:
            raise ValueError(
                f"sde_noise has {sde_noise.shape[0]} rows, the plan needs {plan.num_noises}"
            )
        for name, c in cond.items():
            if c.shape[0] != plan.num_prompts:
                raise ValueError(
                    f"cond[{name!r}] has {c.shape[0]} rows, the plan has {plan.num_prompts} prompts"
                )
        init_noise = init_noise.to(torch.float32)
        if execution == "batched":
            leaves, records, nfe, calls = self._run_batched(plan, cond, init_noise, sde_noise)
        elif execution == "reference":
            leaves, records, nfe, calls = self._run_reference(plan, cond, init_noise, sde_noise)
        else:
            raise ValueError(f"execution must be 'batched' or 'reference', got {execution!r}")
        self.total_nfe += nfe
        self.total_model_calls += calls
        return RolloutResult(
            plan=plan,
            leaf_latents=leaves,
            transitions=_pack(records, init_noise),
            nfe=nfe,
            model_calls=calls,
        )

    # ---------------------------------------------------------------- batched tree
    def _run_batched(self, plan, cond, init_noise, sde_noise):
        # Build the tree: node = (parent, edge); roots are the initial noises.
        parent: list[int] = [-1] * plan.num_roots
        edge_of: list[Edge | None] = [None] * plan.num_roots
        step: list[int] = [0] * plan.num_roots
        prompt: list[int] = list(plan.root_prompt)
        children: list[list[int]] = [[] for _ in range(plan.num_roots)]
        depth_nodes: list[list[int]] = [list(range(plan.num_roots))]
        child_id: dict[tuple[int, Edge], int] = {}
        leaf_node: list[int] = []
        for leaf in plan.leaves:
            node = leaf.root
            for d, e in enumerate(leaf.edges):
                key = (node, e)
                nxt = child_id.get(key)
                if nxt is None:
                    nxt = len(parent)
                    child_id[key] = nxt
                    parent.append(node)
                    edge_of.append(e)
                    step.append(e.to)
                    prompt.append(prompt[node])
                    children.append([])
                    children[node].append(nxt)
                    if len(depth_nodes) <= d + 1:
                        depth_nodes.append([])
                    depth_nodes[d + 1].append(nxt)
                node = nxt
            leaf_node.append(node)

        states: dict[int, torch.Tensor] = {r: init_noise[r] for r in range(plan.num_roots)}
        finals: dict[int, torch.Tensor] = {}
        records: list[_Record] = []
        nfe = calls = 0
        levels = tqdm(depth_nodes, desc="rollout", disable=not self.progress, leave=False)
        for nodes in levels:
            frontier = [n for n in nodes if children[n]]
            for n in nodes:
                if not children[n]:
                    finals[n] = states.pop(n).clone()  # detach from the level's batch
            if not frontier:
                continue
            x = torch.stack([states[n] for n in frontier])
            steps = torch.tensor([step[n] for n in frontier])
            v, c = self._velocity(x, steps, torch.tensor([prompt[n] for n in frontier]), cond)
            nfe += len(frontier)
            calls += c
            kids = [(ch, pos) for pos, n in enumerate(frontier) for ch in children[n]]
            pos = torch.tensor([p for _, p in kids], device=x.device)
            kid_edges = [edge_of[ch] for ch, _ in kids]
            x_next, log_prob, means = self._advance(
                plan, x[pos], v[pos], steps[pos.cpu()], kid_edges, sde_noise
            )
            for row, ((ch, p), e) in enumerate(zip(kids, kid_edges, strict=True)):
                states[ch] = x_next[row]
                if e.trained and e.stochastic:
                    n = frontier[p]
                    records.append(
                        _Record(
                            state_key=n,
                            state=x[p].clone(),
                            step=step[n],
                            prompt=prompt[n],
                            next_sample=x_next[row].clone(),
                            next_step=e.to,
                            log_prob=log_prob[row],
                            adv_slot=e.adv_slot,
                            mean=means[row].clone() if plan.keep_means else None,
                            noise_scale=e.noise_scale,
                        )
                    )
            for n in frontier:
                del states[n]
        leaves = torch.stack([finals[n] for n in leaf_node])
        return leaves, records, nfe, calls

    # ---------------------------------------------------------------- reference loop
    def _run_reference(self, plan, cond, init_noise, sde_noise):
        cache: dict[tuple, torch.Tensor] = {}
        recorded: set[tuple] = set()
        records: list[_Record] = []
        finals = []
        nfe = 0
        leaves = tqdm(plan.leaves, desc="rollout (reference)", disable=not self.progress)
        for leaf in leaves:
            start, x = 0, init_noise[leaf.root]
            for d in range(len(leaf.edges), 0, -1):
                hit = cache.get((leaf.root, leaf.edges[:d]))
                if hit is not None:
                    start, x = d, hit
                    break
            for d in range(start, len(leaf.edges)):
                e = leaf.edges[d]
                t_from = leaf.edges[d - 1].to if d > 0 else 0
                steps = torch.tensor([t_from])
                v, _ = self._velocity(x[None], steps, torch.tensor([leaf.prompt]), cond)
                nfe += 1
                x_next, log_prob, means = self._advance(plan, x[None], v, steps, [e], sde_noise)
                node_key = (leaf.root, leaf.edges[: d + 1])
                if e.trained and e.stochastic and node_key not in recorded:
                    recorded.add(node_key)
                    records.append(
                        _Record(
                            state_key=(leaf.root, leaf.edges[:d]),
                            state=x,
                            step=t_from,
                            prompt=leaf.prompt,
                            next_sample=x_next[0],
                            next_step=e.to,
                            log_prob=log_prob[0],
                            adv_slot=e.adv_slot,
                            mean=means[0] if plan.keep_means else None,
                            noise_scale=e.noise_scale,
                        )
                    )
                if e.store:
                    cache[node_key] = x_next[0]
                x = x_next[0]
            finals.append(x)
        return torch.stack(finals), records, nfe, nfe


def draw_noise(
    plan: RolloutPlan,
    latent_shape: tuple[int, ...],
    generator: torch.Generator,
    rows: slice | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Initial and SDE noise tables for a plan, drawn on the CPU in a fixed order
    (roots, then SDE rows) so that every execution mode sees the same ε. ``rows``: the
    plan is that slice of the roots of a larger plan drawn from the same generator, and
    has no SDE rows (one worker's slice of an evaluation spread over several sees the
    noise it would see alone)."""
    if rows is None:
        init = torch.randn((plan.num_roots, *latent_shape), generator=generator)
        sde = torch.randn((plan.num_noises, *latent_shape), generator=generator)
        return init, sde
    init = torch.randn((rows.stop, *latent_shape), generator=generator)[rows]
    return init, torch.zeros((0, *latent_shape))


def _pack(records: list[_Record], like: torch.Tensor) -> Transitions:
    """Canonical order (step, advantage slot) so both execution modes agree row for row."""
    records = sorted(records, key=lambda r: (r.step, r.adv_slot, r.next_step))
    state_row: dict[object, int] = {}
    states, state_step, state_prompt, state_index = [], [], [], []
    for r in records:
        if r.state_key not in state_row:
            state_row[r.state_key] = len(states)
            states.append(r.state)
            state_step.append(r.step)
            state_prompt.append(r.prompt)
        state_index.append(state_row[r.state_key])
    shape = tuple(like.shape[1:])
    empty = like.new_zeros((0, *shape))

    def stack(ts):
        return torch.stack(ts) if ts else empty

    long = dict(dtype=torch.long)
    return Transitions(
        states=stack(states),
        state_step=torch.tensor(state_step, **long),
        state_prompt=torch.tensor(state_prompt, **long),
        next_samples=stack([r.next_sample for r in records]),
        next_step=torch.tensor([r.next_step for r in records], **long),
        old_log_probs=torch.stack([r.log_prob for r in records]) if records else torch.zeros(0),
        state_index=torch.tensor(state_index, **long),
        adv_slot=torch.tensor([r.adv_slot for r in records], **long),
        old_means=(
            stack([r.mean for r in records]) if records and records[0].mean is not None else None
        ),
        noise_scale=(
            torch.tensor([r.noise_scale for r in records], dtype=torch.float64)
            if any(r.noise_scale != 1.0 for r in records)
            else None
        ),
    )
