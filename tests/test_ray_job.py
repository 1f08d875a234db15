"""`ray job submit` against a local Ray head runs a one-iteration training job."""

import os
import shutil
import subprocess
import sys

from g2rpo.common.net import free_port
from g2rpo.orchestration.driver import read_metrics
from g2rpo.reward_server.process import g2rpo_executable


def test_ray_job_submit_completes_one_iteration(quick_world, tmp_path):
    ray_exe = shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    gcs, dash = free_port(), free_port()
    subprocess.run(
        [
            ray_exe,
            "start",
            "--head",
            f"--port={gcs}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            "--num-cpus=5",  # 2 workers, learner, reward replica, evaluator
            "--disable-usage-stats",
        ],
        env=env,
        check=True,
        timeout=180,
        capture_output=True,
    )
    try:
        work = tmp_path / "job"
        work.mkdir()
        (work / "job.yaml").write_text(f"""
model: {{pretrained: {quick_world / "pipeline"}}}
sampling: {{num_steps: 6, sde_steps: [0, 1], granularities: [1, 2], group_size: 4,
           prompts_per_worker: 2}}
rewards: [{{name: shapes_clip}}]
run: {{name: job, iterations: 1, output_dir: {tmp_path / "runs"}}}
train:
  image_size: 32
  max_sequence_length: 16
  workers: {{count: 2}}
  eval: {{samples: 4}}
  reward: {{scorers: ["shapes_clip={quick_world / "shapes_clip"}"]}}
""")
        res = subprocess.run(
            [
                ray_exe,
                "job",
                "submit",
                "--address",
                f"http://127.0.0.1:{dash}",
                "--working-dir",
                str(work),
                "--",
                g2rpo_executable(),
                "train",
                "--config",
                "job.yaml",
                "--no-progress",
            ],
            env=env,
            timeout=600,
            capture_output=True,
            text=True,
            check=False,
        )
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        assert "succeeded" in out.lower()
        rows = read_metrics(tmp_path / "runs" / "job")
        assert [r["iteration"] for r in rows] == [0] and rows[0]["transitions"] == 32
    finally:
        subprocess.run(
            [ray_exe, "stop", "--force"], env=env, timeout=120, capture_output=True, check=False
        )
