"""The small training setting the Ray and learner tests share (committed world, 32-px
images, a 6-step grid); a test file appends only what it changes."""

import contextlib
from pathlib import Path

# one prompt per worker and iteration: the tests read counts and wiring, not learning, and a
# second prompt per worker costs about 40 s over the suite (tests/test_learner_group.py keeps
# two, for the ranks' split of a worker's prompts; tests/test_lora.py as many as it samples)
PROMPTS_PER_WORKER = 1

SMALL_RUN = [
    "sampling.num_steps=6",
    "sampling.sde_steps=[0,1]",
    "sampling.granularities=[1,2]",
    "sampling.group_size=4",
    f"sampling.prompts_per_worker={PROMPTS_PER_WORKER}",
    "train.workers.count=2",
    "train.image_size=32",
    "train.max_sequence_length=16",
    "train.eval.every=1",
    "train.eval.samples=4",  # 4 held-out prompts × 2 samples: enough for the paired CI,
    "train.eval.per_prompt=2",  # and every iteration of every test run evaluates them
    "train.checkpoints.every=1",
    "optim.lr=1e-4",
    "rewards=[{name: shapes_clip}]",
    # .ci/run's pytest processes start together on 2 cores: a run's actors then import
    # torch beside many other processes, and with three processes the first run's took
    # over the tiny world's scaled 120 s once (CI, 2026-11-28). A bound: a start or a
    # restart that succeeds is waited for only as long as it takes
    "train.workers.start_timeout_s=600",
]

# one rollout worker of 2 prompts on the committed shapes world, 6 steps, SDE steps 0 and 2:
# the in-process (no Ray) engine and learner tests
SHAPES_WORLD = Path(__file__).resolve().parents[1] / "assets" / "shapes-world"
ONE_WORKER = [
    f"model.pretrained={SHAPES_WORLD / 'pipeline'}",
    "sampling.num_steps=6",
    "sampling.sde_steps=[0, 2]",
    "sampling.group_size=3",
    "sampling.prompts_per_worker=2",
    "train.workers.count=1",
]

# conftest's overlapped run (a 2-learner group), its weights broadcast by the workers'
# collective group
OVERLAPPED_BROADCAST = [
    "train.weights.staleness=1",
    "train.learner.count=2",
    "train.weights.transport=collective",
]


def small_train(world, out, name, iterations, extra=(), *, reward_url=None, **kw):
    """``g2rpo train`` of the small setting on ``world`` (conftest's), scored with the
    world's shapes_clip by the reward server at ``reward_url`` (conftest's session
    ``scorer_url``: one server for the runs, not one replica actor each to start) or,
    without one, by a job-started replica."""
    from g2rpo.orchestration.driver import train

    rewards = f"train.reward.scorers=[shapes_clip={world / 'shapes_clip'}]"
    if reward_url is not None:
        rewards = f"train.reward.urls=[{reward_url}]"
    over = [
        *SMALL_RUN,
        f"model.pretrained={world / 'pipeline'}",
        f"run.output_dir={out}",
        f"run.name={name}",
        f"run.iterations={iterations}",
        rewards,
        # held-out evaluation on worker 0: one actor fewer to start per run (the
        # evaluator actor is trained with by tests/test_placement.py, test_monitoring.py,
        # test_paper_recipe.py and test_ray_job.py)
        "train.eval.on_actor=false",
        *extra,
    ]
    return train(None, over, progress=False, **kw)


def when_rows(run_dir, n: int, act, then_wait: float = 0.0, timeout: float = 600):
    """Start a thread that runs ``act(actors.json record)`` once, ``then_wait`` s
    after the run at ``run_dir`` logged ``n`` iterations; ``act`` returns a dict
    merged into the one returned here."""
    import json
    import threading
    import time

    done: dict = {}

    def watch():
        metrics, actors = run_dir / "metrics.jsonl", run_dir / "actors.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if metrics.exists() and actors.exists():
                rows = [ln for ln in metrics.read_text().splitlines() if ln.strip()]
                if len(rows) >= n:
                    record = json.loads(actors.read_text())
                    time.sleep(then_wait)
                    done.update(act(record))
                    return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, done


def when_first_row(run_dir, act, then_wait: float = 0.3):
    """``when_rows`` after the first iteration, ``then_wait`` s on: early in the next one."""
    return when_rows(run_dir, 1, act, then_wait)


def assert_stopped_with_checkpoint(log: str, run_dir) -> None:
    """A run stopped as Ctrl-C stops it: ``log`` (its output) names the last iteration
    done and how to resume, and that iteration's checkpoint is on disk."""
    done = int(log.split("interrupted after iteration ")[1].split(";")[0])
    assert f"resume with: g2rpo train --resume {run_dir}" in log, log[-2000:]
    assert done >= 1 and (run_dir / "checkpoints" / f"it_{done:05d}.pt").is_file()


@contextlib.contextmanager
def formed_learner_and_workers(warm, cfg):
    """A formed learner group and rollout workers 0 and 1 for ``cfg``, ready: the
    session's kept ones where it has them (as a run takes them). Given back to the
    session when the block passes, stopped when it raises."""
    import ray
    from g2rpo.orchestration.cluster import RunActors, new_learner_group
    from g2rpo.orchestration.placement import learner_placement_group

    t = cfg.train
    warm.start_run()
    options = t.ray_options(t.learner)
    kept = warm.learner_group(cfg, options)
    if kept is None:
        pg = learner_placement_group(cfg)
        ray.get(pg.ready(), timeout=60)
        kept = new_learner_group(cfg, options, pg), pg
    actors = RunActors(learner=kept[0], learner_pg=kept[1])
    actors.workers = warm.rollout_workers(
        cfg.model_dump(mode="json"), [0, 1], t.ray_options(t.workers)
    )
    try:
        actors.learner.form()
        ray.get(actors.learner.ready_refs() + [w.ready.remote() for w in actors.workers])
        yield actors
    except BaseException:
        actors.stop()
        raise
    warm.keep(actors)
