"""What `g2rpo rehearse` changes in a recipe, and what it keeps (no Ray, no models)."""

from __future__ import annotations

from pathlib import Path

import pytest
from g2rpo.common.config.loading import load_config
from g2rpo.common.errors import UsageError
from g2rpo.orchestration.rehearsal_setup import MAX_ACTORS, rehearsal_of

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
FLUX = sorted(
    p for p in CONFIGS.glob("*.yaml") if "FLUX" in (load_config(p).model.pretrained or "")
)


def _rehearsed(path: Path, root: Path, nodes: int = 2):
    recipe = load_config(path)
    plan = rehearsal_of(recipe, root, nodes, 2)
    return recipe, load_config(path, plan.overrides), plan


@pytest.mark.parametrize("path", FLUX, ids=lambda p: p.name)
def test_every_flux_recipe_has_a_rehearsal_that_keeps_its_sizes(path, tmp_path):
    recipe, cfg, plan = _rehearsed(path, tmp_path)
    # kept: what a request, an object or a placement is made of
    # the VAE's decode batch (a GPU memory setting) is the one sampling field it changes
    decode = {"decode_batch": 1}
    assert cfg.sampling == recipe.sampling.model_copy(update=decode)
    assert cfg.algorithm == recipe.algorithm
    assert cfg.train.image_size == recipe.train.image_size
    assert cfg.train.max_sequence_length == recipe.train.max_sequence_length
    assert cfg.train.eval.samples == recipe.train.eval.samples
    assert cfg.train.eval.per_prompt == recipe.train.eval.per_prompt
    assert cfg.train.eval.on_actor == recipe.train.eval.on_actor
    assert cfg.train.reward.request_mib == recipe.train.reward.request_mib
    assert cfg.train.weights == recipe.train.weights
    assert (cfg.model.lora is None) == (recipe.model.lora is None)
    for kind in ("workers", "learner", "eval", "reward"):
        mine, theirs = getattr(cfg.train, kind), getattr(recipe.train, kind)
        assert (mine.num_gpus, mine.num_cpus, mine.resources) == (
            theirs.num_gpus,
            theirs.num_cpus,
            theirs.resources,
        )
    # scaled by the stated rule, a group staying a group
    t, r = cfg.train, recipe.train
    assert t.workers.count == min(r.workers.count, MAX_ACTORS)
    assert t.learner.count == min(r.learner.count, MAX_ACTORS)
    assert (t.learner.count > 1) == (r.learner.count > 1)
    assert cfg.model.device == "cpu" and cfg.model.dtype == "float32"
    assert cfg.run.output_dir == str(tmp_path / "runs") and cfg.run.iterations == 2
    # the nodes hold it: the GPUs asked, and one node for the whole learner group
    gpus = (
        t.workers.count * t.workers.num_gpus
        + t.learner.count * t.learner.reserved_gpus()
        + (t.eval.num_gpus if t.eval.on_actor else 0)
        + t.reward.job_replicas() * t.reward.num_gpus
    )
    assert sum(n.num_gpus for n in plan.nodes) >= gpus
    assert max(n.num_gpus for n in plan.nodes) >= t.learner.count * t.learner.reserved_gpus()
    # a random stand-in for every scorer
    assert set(plan.scorers) >= {x.name for x in recipe.rewards}


def test_a_rehearsal_needs_two_iterations_and_a_node():
    recipe = load_config(CONFIGS / "flux_hps.yaml")
    with pytest.raises(UsageError, match="--iterations 1"):
        rehearsal_of(recipe, Path("/x"), 2, 1)
    with pytest.raises(UsageError, match="--nodes 0"):
        rehearsal_of(recipe, Path("/x"), 0, 2)
