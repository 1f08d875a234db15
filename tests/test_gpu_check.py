"""bin/gpu-check's stages are `g2rpo` command lines no CI machine can run (FLUX.1-dev's
width and depth on a GPU). This runs the script itself with `g2rpo` on PATH standing for
the real parser: every stage's arguments must parse and every config it names (with its
--set lines) must load, so a renamed flag or field fails here, not on the one GPU run
a session may get."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PARSE_ONLY = f"""#!{sys.executable}
import sys
from g2rpo.cli import build_parser
from g2rpo.common.config.loading import load_config

args = build_parser().parse_args(sys.argv[1:])
config = getattr(args, "config", None)
if isinstance(config, str):
    load_config(config, list(getattr(args, "set", [])))
print("{{}}")
"""


def test_every_stage_parses_and_loads_its_config(tmp_path):
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "g2rpo").write_text(PARSE_ONLY)
    (shim / "g2rpo").chmod(0o755)
    (tmp_path / "work" / "flux1-dev" / "pipeline").mkdir(parents=True)
    (tmp_path / "work" / "flux1-dev" / "pipeline" / "model_index.json").write_text("{}")
    env = {
        **os.environ,
        "PATH": f"{shim}:{os.environ['PATH']}",
        "GPU_CHECK_DEVICE": "cpu",
        "GPU_CHECK_WORK": str(tmp_path / "work"),
    }
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(REPO / "bin" / "gpu-check"), str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    log = (out / "log.txt").read_text()
    ends = [line for line in log.splitlines() if line.startswith("=== ") and "exit" in line]
    stages = [line.split()[1].rstrip(":") for line in ends]
    never_run = ["doctor_colocated", "ipc_handoff_full", "engine_full_compiled", "handoff_full"]
    assert stages[:4] == never_run, log  # what has never run on a GPU first
    assert len(stages) == 15, log
    failed = [line for line in ends if not re.search(r": exit 0 after \d+s$", line)]
    assert failed == [], log[-4000:]
    assert proc.returncode == 0
    assert "model.pretrained=" in log  # doctor_flux_lora reuses handoff_full's pipeline


def test_a_second_call_runs_only_the_stages_it_names(tmp_path):
    """GPU_CHECK_STAGES: what the first call's budget did not reach, in a second call."""
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "GPU_CHECK_STAGES": "nothing_of_that_name"}
    out = tmp_path / "out"
    subprocess.run(
        ["bash", str(REPO / "bin" / "gpu-check"), str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    log = (out / "log.txt").read_text()
    assert "=== doctor_colocated: not run (not in GPU_CHECK_STAGES)" in log
    assert "exit" not in log  # nothing ran
