"""What the learner-group tests share (tests/test_learner_group.py,
tests/test_learner_group_weights.py): their config, a module's reusable group of 2 ranks,
the largest difference of two states, a module's weights scaled in place (in a rank)."""

import sys

import ray
import torch
from g2rpo.common.config.actor import ActorResources
from g2rpo.common.config.loading import load_config
from g2rpo.learner.group import LearnerGroup
from small_run import SMALL_RUN

# the tests' functions that run inside the ranks (``__ray_call__``) call some of these,
# and the ranks' processes cannot import this module: it travels by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _cfg(world, *extra):
    # two prompts per worker (SMALL_RUN has one): each rank's share of the batches is more
    # than one prompt, and the padding case (tests/test_learner_group.py) has fewer prompts
    # than ranks
    over = [*SMALL_RUN, "sampling.prompts_per_worker=2", f"model.pretrained={world / 'pipeline'}"]
    return load_config(None, [*over, *extra])


def learner_groups():
    """A test module's ``group_of`` fixture: yields ``group_of(cfg)``, a formed learner
    group of 2 for ``cfg``. The module's tests share two rank processes, reconfigured for
    each (as a warm run takes them, orchestration/warm_actors.py) instead of two new
    processes importing torch each; they are killed when the module is done."""
    kept: list = []

    def group_of(cfg, before_form=None) -> LearnerGroup:
        options, cfg_dict = ActorResources().ray_options(), cfg.model_dump(mode="json")
        if kept:
            try:
                ray.get([r.reconfigure.remote(cfg_dict, i, 2) for i, r in enumerate(kept)])
            except ray.exceptions.RayError:  # an earlier case's failure took them: new ones
                for rank in kept:
                    ray.kill(rank, no_restart=True)
                kept.clear()
        group = LearnerGroup(cfg, options, list(kept) or None)
        kept[:] = group.ranks
        if before_form is not None:
            before_form(group)
        group.form()
        ray.get(group.ready_refs())
        return group

    yield group_of
    for rank in kept:
        ray.kill(rank, no_restart=True)


def _max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _scale_module(module: torch.nn.Module, factor: float) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(factor)
