"""`ray job submit` against a Ray head of the test's own runs a one-iteration
training job; the head is stopped by its own process group (servers.RayHead), never
by ``ray stop``, which would reach every Ray of the user's on the machine."""

import os
import shutil
import subprocess
import sys
import time

import pytest
from g2rpo.orchestration.driver import read_metrics
from g2rpo.reward_server.process import g2rpo_executable
from servers import RayHead

# a training run, a Ray cluster or a service: `pytest -m 'not slow'` leaves it out
pytestmark = pytest.mark.slow


def test_ray_job_submit_completes_one_iteration(world, scorer_url, tmp_path):
    ray_exe = shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")
    # a worker and the learner; the job scores through the session's reward server (a
    # job-started replica: tests/test_placement.py, tests/test_training.py)
    head = RayHead(num_cpus=2, log=tmp_path / "head.log")
    try:
        work = tmp_path / "job"
        work.mkdir()
        (work / "job.yaml").write_text(f"""
model: {{pretrained: {world / "pipeline"}}}
sampling: {{num_steps: 6, sde_steps: [0, 1], granularities: [1, 2], group_size: 4,
           prompts_per_worker: 1}}
rewards: [{{name: shapes_clip}}]
run: {{name: job, iterations: 1, output_dir: {tmp_path / "runs"}}}
train:
  image_size: 32
  max_sequence_length: 16
  workers: {{count: 1}}
  eval: {{samples: 2, per_prompt: 2, on_actor: false}}
  reward: {{urls: ["{scorer_url}"]}}
""")
        submit = [ray_exe, "job", "submit", "--address", head.dashboard_url]
        submit += ["--working-dir", str(work), "--", g2rpo_executable()]
        submit += ["train", "--config", "job.yaml", "--no-progress"]
        deadline = time.monotonic() + 120
        while True:  # the head's job agent registers a little after `ray start` returns
            res = subprocess.run(
                submit, env=head.env, timeout=600, capture_output=True, text=True, check=False
            )
            if "No available agent" not in res.stderr or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        assert "succeeded" in out.lower()
        rows = read_metrics(tmp_path / "runs" / "job")
        assert [r["iteration"] for r in rows] == [0]
        # the command's summary ends at the trained weights' own evaluation (after it 0's update)
        assert "eval/shapes_clip: " in out and "(it 0) -> " in out
        assert "(it 1), paired change " in out, out[-4000:]
        assert rows[0]["transitions"] == 1 * 2 * 4  # prompts · K · G
        # the same job with the recipes' relative run.output_dir: inside the copy of the
        # working directory Ray unpacked into its package cache, it is refused before
        # anything is written (issue 55, item 8; on 3bb9114 it trained there)
        relative = [*submit, "--set", "run.output_dir=runs", "--set", "run.name=cached"]
        res = subprocess.run(
            relative, env=head.env, timeout=600, capture_output=True, text=True, check=False
        )
        out = res.stdout + res.stderr
        assert res.returncode != 0, out[-4000:]
        assert "run.output_dir 'runs' puts the run at" in out, out[-4000:]
        assert "package cache" in out and "--set run.output_dir=/runs" in out
        assert not (work / "runs").exists()  # (nor in the job's own copy: refused first)
    finally:
        head.stop()
    assert not head._left()  # every process the head started is gone
