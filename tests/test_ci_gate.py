""".ci/run (no arguments) runs every test of the suite, the slow tier included (issue 55,
item 12; on 3bb9114 it ran only the tests not marked slow): its pytest commands, as
`.ci/run --dry-run` prints them, are collected here and must together hold each test
of `pytest tests` exactly once.

`.ci/run --fast` (the inner loop) names its tests in bash: the flux_hps rehearsal by node
id, then files that its process runs whole, beside `-m "not slow"` for the rest. A
renamed rehearsal would make it fail at collection; a test marked slow in one of those
files would enter it unseen. Both are read here from the script itself."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gate_settings() -> tuple[str, list[str]]:
    """The rehearsal's node id and the files run after it, as .ci/run assigns them."""
    script = (ROOT / ".ci" / "run").read_text()
    (rehearsal,) = re.findall(r"^rehearsal=(\S+)$", script, re.M)
    (after,) = re.findall(r"^after_rehearsal=\(([^)]*)\)$", script, re.M)
    return rehearsal, after.split()


def marked_slow(node: ast.AST) -> bool:
    """A ``pytest.mark.slow`` anywhere in this node: a decorator or a module's pytestmark."""
    return any(
        isinstance(n, ast.Attribute) and n.attr == "slow" and ast.unparse(n) == "pytest.mark.slow"
        for n in ast.walk(node)
    )


def test_the_gate_names_the_rehearsal_and_only_files_without_slow_tests():
    rehearsal, after = gate_settings()
    path, name = rehearsal.split("::")
    tree = ast.parse((ROOT / path).read_text())
    tests = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
    assert name in tests, f".ci/run's rehearsal {rehearsal} is not a test"
    assert after, "no file after the rehearsal"
    for file in after:
        assert not marked_slow(ast.parse((ROOT / file).read_text())), (
            f"{file} has a test marked slow: .ci/run's gate would run it"
        )


def test_marked_slow_sees_a_decorator_and_a_module_mark():
    assert marked_slow(ast.parse("import pytest\npytestmark = pytest.mark.slow\n"))
    assert marked_slow(ast.parse("@pytest.mark.slow\ndef test_x():\n    pass\n"))
    assert marked_slow(ast.parse("pytestmark = [pytest.mark.slow, pytest.mark.x]\n"))
    assert not marked_slow(
        ast.parse("@pytest.mark.parametrize('a', [1])\ndef test_x(a):\n    pass\n")
    )


def _collected(args: list[str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if "::" in line]


def _commands(*mode: str) -> list[list[str]]:
    out = subprocess.run(
        ["bash", ".ci/run", "--dry-run", *mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    lines = [shlex.split(line) for line in out.splitlines()]
    assert lines and all(line[0] == "pytest" for line in lines), out
    return [line[1:] for line in lines]


def test_ci_run_runs_every_test_of_the_suite_once():
    commands = _commands()
    assert len(commands) == 2  # two processes side by side on CI's 2 cores
    runs = [_collected(args) for args in commands]
    everything = _collected(["tests"])
    assert sorted(runs[0] + runs[1]) == sorted(everything)
    assert not set(runs[0]) & set(runs[1])
