"""A run directory inside a directory Ray owns is refused before anything is written
(issue 55, item 8): the recipes' relative ``run.output_dir: runs`` under
``ray job submit --working-dir .`` lands in Ray's package cache. The end-to-end case,
through a real ``ray job submit``, is in tests/test_ray_job.py."""

import json
from pathlib import Path

import pytest
from g2rpo.common.errors import RunDirError
from g2rpo.orchestration.lifecycle import open_run
from g2rpo.orchestration.scratch_dirs import JOB_CONFIG_VAR, ray_owned_problem

JOB_ENV = {JOB_CONFIG_VAR: json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_ab.zip"}})}


def test_the_job_variable_is_the_one_ray_sets():
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    assert RAY_JOB_CONFIG_JSON_ENV_VAR == JOB_CONFIG_VAR


def test_a_relative_run_dir_in_a_submitted_working_dir_is_refused(tmp_path):
    pkg = tmp_path / "raytmp/session_1/runtime_resources/working_dir_files/_ray_pkg_ab"
    pkg.mkdir(parents=True)
    problem = ray_owned_problem(pkg / "runs/x", "runs", cwd=pkg, environ=JOB_ENV)
    assert "run.output_dir 'runs'" in problem and "package cache" in problem
    assert "--set run.output_dir=/runs" in problem
    # the session's temporary directory (a `ray start --temp-dir`) is Ray's too
    assert "temporary directory" in ray_owned_problem(
        tmp_path / "raytmp/session_1/logs/r", "x", cwd=pkg, environ={}
    )
    # an absolute directory elsewhere is fine, with or without a job
    assert ray_owned_problem(tmp_path / "runs/x", "/runs", cwd=pkg, environ=JOB_ENV) is None
    # outside a job the working directory is the user's own
    assert ray_owned_problem(tmp_path / "w/runs/x", "runs", cwd=tmp_path / "w", environ={}) is None


def test_open_run_refuses_ray_temp_dir_before_writing(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    target = tmp_path / "ray" / "runs"
    with pytest.raises(RunDirError, match=r"run.output_dir .* Ray's temporary directory"):
        open_run("configs/tiny.yaml", [f"run.output_dir={target}"], None)
    assert not target.exists()
    with pytest.raises(RunDirError, match="Ray's temporary directory"):
        (target / "tiny").mkdir(parents=True)
        (target / "tiny" / "config.yaml").write_text(Path("configs/tiny.yaml").read_text())
        open_run(None, [], target / "tiny")
