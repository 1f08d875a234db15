"""Tree-shaped rollout plans: BranchGRPO's binary tree with SDE on every edge and
TreeGRPO's ODE trunk with a window of binary SDE splits (``rollout_worker/plan.py`` and
``rollout_worker/member_plans.py`` have the other methods' builders; the plan itself is
``common/algorithms/rollout_plan.py``).
A tree's node below the root has one advantage slot, p·N + node (N nodes per tree);
``learner/advantages.py`` turns leaf rewards into the nodes' advantages."""

from __future__ import annotations

from ..common.algorithms.rollout_plan import Edge, Leaf, RolloutPlan, eval_anchors


def branchgrpo_plan(
    num_prompts: int,
    num_steps: int,
    split_steps: list[int],
    *,
    eta: float = 0.3,
    prune_depths: list[int] = (),
    split_noise_scale: float = 1.0,
    eval_anchor: bool = True,
) -> RolloutPlan:
    """BranchGRPO (arXiv 2509.06040; Fredreic1849/BranchGRPO train_branchgrpo_flux.py):
    one tree per prompt from one noise, SDE on every edge, every node stepped twice (two
    noise rows) at a split step and once elsewhere: 2^|splits| leaves. Every edge is
    trained with the advantage of the node it reaches (slot p·N + node, N nodes per tree
    below the root; ``learner/advantages.py`` gives the per-depth advantages). Depth
    pruning (BranchGRPO-DepPru): edges into nodes at ``prune_depths`` (1 = the root's
    children) are sampled as before but not trained. Split edges draw their noise at
    ``split_noise_scale`` × the SDE's std (their 4.0), and record that density's
    log-prob (their code scores them at the unscaled std: newer-methods.md §4g.1)."""
    splits = set(split_steps)
    if not splits or min(splits) < 0 or max(splits) > num_steps - 1:
        raise ValueError(f"split steps {sorted(splits)} must lie in [0, T-1={num_steps - 1}]")
    per_tree = sum(2 ** sum(s <= t for s in splits) for t in range(num_steps))
    tree = _SDETree(per_tree)
    leaves: list[Leaf] = []
    for p in range(num_prompts):
        paths: list[tuple[Edge, ...]] = [()]
        tree.new_tree(p)
        for t in range(num_steps):
            split = t in splits
            paths = tree.grow(
                paths,
                t,
                children=2 if split else 1,
                trained=t + 1 not in prune_depths,
                noise_scale=split_noise_scale if split else 1.0,
            )
        leaves += [
            Leaf(root=p, prompt=p, edges=path, kind="sample", coords=(p, j))
            for j, path in enumerate(paths)
        ]
    if eval_anchor:
        leaves += eval_anchors(num_prompts, num_steps)
    return RolloutPlan(
        algorithm="branchgrpo",
        num_steps=num_steps,
        sde_type="dance",
        eta=eta,
        num_prompts=num_prompts,
        group_size=2 ** len(splits),
        root_prompt=list(range(num_prompts)),
        num_noises=tree.noises,
        leaves=leaves,
        adv_shape=(num_prompts, per_tree),
    )


def treegrpo_start(iteration: int, num_steps: int, depth: int, start: int, slide_every: int) -> int:
    """TreeGRPO's first branching step: ``start``, one step later every ``slide_every``
    iterations (0: never), up to the last start whose window ends before the last step
    (T−1−depth: the window's last split is step T−2, as MixGRPO's window ends short of
    σ=0)."""
    last = num_steps - 1 - depth
    if depth < 1 or last < 0:
        raise ValueError(f"a TreeGRPO window of {depth} splits needs num_steps >= {depth + 1}")
    if not 0 <= start <= last:
        raise ValueError(f"window start {start} must lie in [0, T-1-depth = {last}]")
    moves = iteration // slide_every if slide_every > 0 else 0
    return min(start + moves, last)


def treegrpo_plan(
    num_prompts: int,
    num_steps: int,
    depth: int,
    *,
    start: int,
    eta: float = 0.7,
    eval_anchor: bool = True,
) -> RolloutPlan:
    """TreeGRPO (arXiv 2512.08153; its code was not found, newer-methods.md §5 follows a
    secondary walkthrough): one tree per prompt from one noise, an ODE trunk to step
    ``start``, then ``depth`` consecutive split steps where every node takes two
    Flow-GRPO SDE steps (two noise rows), then ODE completion of the 2^depth leaves.
    Every SDE edge is trained with the advantage of the node it reaches; the two
    children of a node start from one state, so the learner takes one forward per
    internal node (2^depth − 1 of them) for its 2^(depth+1) − 2 edges."""
    if start < 0 or start + depth > num_steps - 1:
        raise ValueError(
            f"TreeGRPO window [{start}, {start + depth}) must end before step {num_steps - 1}"
        )
    per_tree = 2 ** (depth + 1) - 2
    tree = _SDETree(per_tree)
    leaves: list[Leaf] = []
    trunk = tuple(Edge(to=t) for t in range(1, start + 1))
    tail = tuple(Edge(to=t) for t in range(start + depth + 1, num_steps + 1))
    for p in range(num_prompts):
        paths: list[tuple[Edge, ...]] = [trunk]
        tree.new_tree(p)
        for t in range(start, start + depth):
            paths = tree.grow(paths, t, children=2, trained=True)
        leaves += [
            Leaf(root=p, prompt=p, edges=path + tail, kind="sample", coords=(p, j))
            for j, path in enumerate(paths)
        ]
    if eval_anchor:
        leaves += eval_anchors(num_prompts, num_steps)
    return RolloutPlan(
        algorithm="treegrpo",
        num_steps=num_steps,
        sde_type="flow",
        eta=eta,
        num_prompts=num_prompts,
        group_size=2**depth,
        root_prompt=list(range(num_prompts)),
        num_noises=tree.noises,
        leaves=leaves,
        adv_shape=(num_prompts, per_tree),
    )


class _SDETree:
    """Grows the trees of a plan by SDE edges: each new edge takes the next noise row
    and the next node slot of its prompt's tree (p·N + node)."""

    def __init__(self, nodes_per_tree: int) -> None:
        self.nodes_per_tree = nodes_per_tree
        self.noises = 0
        self.prompt = 0
        self.node = 0

    def new_tree(self, prompt: int) -> None:
        self.prompt, self.node = prompt, 0

    def grow(
        self,
        paths: list[tuple[Edge, ...]],
        t: int,
        *,
        children: int,
        trained: bool,
        noise_scale: float = 1.0,
    ) -> list[tuple[Edge, ...]]:
        """Every path extended by ``children`` SDE steps from step t, in path order."""
        grown = []
        for path in paths:
            for _ in range(children):
                slot = self.prompt * self.nodes_per_tree + self.node
                edge = Edge(
                    to=t + 1,
                    noise=self.noises,
                    trained=trained,
                    adv_slot=slot,
                    noise_scale=noise_scale,
                )
                grown.append((*path, edge))
                self.noises += 1
                self.node += 1
        return grown
