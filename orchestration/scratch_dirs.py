"""Directories Ray owns, where a run directory must never land.

``ray job submit --working-dir .`` runs the entrypoint inside the copy of the working
directory that Ray unpacked into its package cache (under its temporary directory,
``/tmp/ray/session_*/runtime_resources/working_dir_files/_ray_pkg_*``). A recipe's
relative ``run.output_dir: runs`` then puts the run, checkpoints and all (133 GiB for
``flux_hps``), into that cache: node-local, never shared, and deleted when Ray
cleans up. On a one-node cluster nothing else notices (the shared-directory probe
passes), so the run is refused here, before anything is written."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

# the variable Ray's job supervisor gives the entrypoint (runtime_env and metadata);
# ray._private.runtime_env.constants.RAY_JOB_CONFIG_JSON_ENV_VAR names it
JOB_CONFIG_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def ray_owned_dirs(cwd: Path, environ: Mapping[str, str]) -> list[tuple[Path, str]]:
    """(directory, what it is) for each directory Ray owns that this process can tell."""
    owned = []
    job = environ.get(JOB_CONFIG_VAR)
    if job:
        try:
            working_dir = json.loads(job).get("runtime_env", {}).get("working_dir")
        except (ValueError, AttributeError):
            working_dir = None
        if working_dir:
            owned.append((cwd, "the copy of `ray job submit --working-dir` in Ray's package cache"))
    temp = Path(environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"
    owned.append((temp, "Ray's temporary directory"))
    parts = cwd.parts
    if "runtime_resources" in parts:  # a session's cache under a `ray start --temp-dir`
        session = Path(*parts[: parts.index("runtime_resources")])
        owned.append((session.parent, "Ray's temporary directory"))
    return owned


def ray_owned_problem(
    run_dir: Path, output_dir: str, cwd: Path | None = None, environ=None
) -> str | None:
    """Why ``run_dir`` (from ``run.output_dir`` = ``output_dir``) cannot hold a run, or
    None when it can."""
    cwd = (cwd or Path.cwd()).resolve()
    environ = os.environ if environ is None else environ
    where = run_dir.resolve()
    for directory, what in ray_owned_dirs(cwd, environ):
        directory = directory.resolve()
        if where == directory or directory in where.parents:
            return (
                f"run.output_dir {output_dir!r} puts the run at {where}, inside {what} "
                f"({directory}): Ray keeps that on one node and deletes it when it cleans up, "
                "so checkpoints would be lost. Set run.output_dir to an absolute path on "
                "storage every node mounts (e.g. --set run.output_dir=/runs)"
            )
    return None
