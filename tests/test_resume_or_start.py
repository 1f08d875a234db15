"""A retried or re-applied job continues its run (issue 55, item 4): ``g2rpo train
--resume-or-start`` starts a run its config names when its directory holds none, and
resumes it from its last checkpoint when it does; ``train.checkpoints.every_minutes``
checkpoints by wall time, so a retry redoes at most that much whatever
``train.checkpoints.every`` says. The two sessions give the uninterrupted run's rows
(conftest's ``calm_run``)."""

from types import SimpleNamespace

from g2rpo.common.config.loading import dump_config, load_config
from g2rpo.orchestration.driver import read_metrics, train
from g2rpo.orchestration.lifecycle import checkpoint_due, run_to_continue
from g2rpo.run_directory.files import iteration_of, list_checkpoints
from small_run import SMALL_RUN


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_checkpoint_due_by_iterations_pins_and_wall_time():
    ckpt = SimpleNamespace(every=50, at=[150], every_minutes=30.0)
    assert checkpoint_due(50, 0.0, ckpt) and checkpoint_due(150, 0.0, ckpt)
    assert not checkpoint_due(7, 29.9 * 60, ckpt)
    assert checkpoint_due(7, 30 * 60, ckpt)  # 30 minutes since the last, whatever N
    assert not checkpoint_due(7, 10**6, SimpleNamespace(every=50, at=[], every_minutes=None))


def test_a_retried_job_resumes_its_run_and_gets_the_uninterrupted_rows(
    calm_run, warm, world, scorer_url, tmp_path, capsys
):
    over = [
        *SMALL_RUN,
        f"model.pretrained={world / 'pipeline'}",
        f"run.output_dir={tmp_path}",
        "run.name=retried",
        "run.iterations=3",
        f"train.reward.urls=[{scorer_url}]",
        "train.eval.on_actor=false",
        # no checkpoint by count before the session's last: only the wall-time one
        "train.checkpoints.every=100",
        "train.checkpoints.every_minutes=1e-9",
    ]
    job = tmp_path / "job.yaml"  # the ConfigMap's file, as the RayJob's entrypoint reads it
    job.write_text(dump_config(load_config(None, over)))
    assert run_to_continue(job, []) is None  # nothing there yet: it starts
    run = train(job, [], progress=False, max_iterations=2, warm=warm)  # then the pod dies
    # iteration 1 by wall time (every 100 would not), 2 as the session's last
    assert [iteration_of(p) for p in list_checkpoints(run)] == [1, 2]

    # re-applied with an edited ConfigMap: the run's recorded config wins, and says so
    job.write_text(job.read_text().replace("seed: 10000", "seed: 7"))
    capsys.readouterr()
    assert run_to_continue(job, []) == run
    err = capsys.readouterr().err
    assert f"{run} holds a run: resuming it" in err
    assert "differs from the run's config.yaml in train.eval.seed" in err
    train(None, [], resume=run, progress=False, warm=warm)
    assert _strip(read_metrics(run)) == _strip(read_metrics(calm_run))
