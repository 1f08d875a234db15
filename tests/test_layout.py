"""The tree a newcomer reads: no import cycle between the top-level folders, the
layering docs/design.md describes, and its module map naming exactly the modules
there are."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = [
    "common",
    "reward_server",
    "rollout_worker",
    "learner",
    "run_directory",
    "world",
    "evaluation",
    "planning",
    "orchestration",
    "benchmarks",
    "cli",
]
# The command's folder is the package's top: pyproject maps the import name ``g2rpo`` to
# cli/ (its modules are g2rpo.cli, g2rpo.cli_plan, ...); every other folder installs as
# the subpackage g2rpo.<folder>.
TOP = "cli"
# Each folder may import only the folders listed before it here (and itself).
LAYERS = {
    "common": set(),
    "reward_server": {"common"},
    "rollout_worker": {"common", "reward_server"},
    "learner": {"common", "rollout_worker"},
    "run_directory": {"common", "learner"},
    "world": {"common", "reward_server", "rollout_worker"},
    "evaluation": {"common", "reward_server", "rollout_worker", "learner", "run_directory"},
    "planning": {"common", "rollout_worker", "learner", "evaluation", "world"},
    "orchestration": {
        "common",
        "reward_server",
        "rollout_worker",
        "learner",
        "run_directory",
        "evaluation",
        "planning",
    },
    "benchmarks": {"common", "reward_server", "rollout_worker", "learner", "planning"},
    "cli": set(FOLDERS),
}


def _modules(folder: str, root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts)


def imported_folders(path: Path, root: Path = ROOT) -> set[str]:
    """The top-level folders a module imports from (relative or ``g2rpo.`` imports,
    at module level or inside functions)."""
    rel = path.relative_to(root).with_suffix("").parts
    package = list(rel[1:-1]) if rel[0] == TOP else list(rel[:-1])

    def folder_of(name: str) -> str | None:  # the folder that holds g2rpo.<name>
        if name in FOLDERS and name != TOP:
            return name
        return TOP if (root / TOP / f"{name}.py").is_file() else None

    names = []  # the first name under g2rpo of each import
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = base + (node.module.split(".") if node.module else [])
            names += [target[0]] if target else [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "g2rpo":
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("g2rpo."):
            names.append(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            names += [a.name.split(".")[1] for a in node.names if a.name.startswith("g2rpo.")]
    return {f for f in map(folder_of, names) if f is not None} - {rel[0]}


def folder_graph() -> dict[str, set[str]]:
    graph = {f: set() for f in FOLDERS}
    for folder in FOLDERS:
        for path in _modules(folder):
            graph[folder] |= imported_folders(path)
    return graph


def test_each_folder_imports_only_the_layers_below_it():
    graph = folder_graph()
    wrong = {f: sorted(graph[f] - LAYERS[f]) for f in FOLDERS if graph[f] - LAYERS[f]}
    assert not wrong, f"imports against the layering: {wrong}"


def test_the_folder_graph_has_no_cycle():
    graph = folder_graph()

    def reaches(a: str, b: str) -> bool:
        seen, stack = set(), [a]
        while stack:
            for nxt in graph[stack.pop()]:
                if nxt == b:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return False

    cycles = [(a, b) for a in FOLDERS for b in graph[a] if reaches(b, a)]
    assert not cycles, f"import cycles between folders: {cycles}"


def test_the_checker_sees_every_kind_of_import(tmp_path):
    """Relative imports upward (also inside a function) and ``g2rpo.`` imports."""
    probe = tmp_path / "common" / "sub" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(
        "from ...orchestration.driver import train\n"
        "from . import sibling\n"
        "def f():\n    from ...learner import trainer\n"
        "import g2rpo.world.pretrain\n"
    )
    assert imported_folders(probe, tmp_path) == {"orchestration", "learner", "world"}
    # the command's folder is the package's top: its modules are g2rpo.<module>
    (tmp_path / TOP).mkdir()
    (tmp_path / TOP / "cli_plan.py").write_text("")
    probe.write_text("from g2rpo import cli_plan, __version__\nimport g2rpo.cli_plan\n")
    assert imported_folders(probe, tmp_path) == {TOP}
    command = tmp_path / TOP / "cli.py"
    command.write_text("from .cli_plan import main\nfrom .common import config\n")
    assert imported_folders(command, tmp_path) == {"common"}


def test_no_folder_of_the_checkout_stands_for_the_import_name():
    """A Ray job's working dir (the checkout, first on PYTHONPATH) must not hide the
    installed package: the command's folder is not named ``g2rpo`` and pyproject maps the
    name to it (tests/test_packaging.py runs an installed wheel that way)."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["package-dir"]["g2rpo"] == TOP
    assert "g2rpo" not in {target.split("/")[0] for target in tool["package-dir"].values()}
    assert not (ROOT / "g2rpo" / "__init__.py").exists() and not (ROOT / "g2rpo.py").exists()


def test_the_design_module_map_names_every_module_and_no_other():
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    named = {
        m
        for m in re.findall(r"`([a-z_0-9]+/[a-z_0-9/]+\.py)`", section)
        if m.split("/")[0] in FOLDERS
    }
    actual = {
        str(p.relative_to(ROOT))
        for folder in FOLDERS
        for p in _modules(folder)
        if p.name != "__init__.py" and "scorers" not in p.parts and "convert" not in p.parts
    }
    assert sorted(actual - named) == [], "modules missing from docs/design.md's module map"
    assert sorted(named - actual) == [], "docs/design.md names modules that do not exist"


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """g2rpo's module → the g2rpo modules it imports (at module level or inside a
    function: an import deferred into a function is still a cycle a reader must hold)."""

    def name_of(path: Path) -> str:
        rel = path.relative_to(root).with_suffix("").parts
        parts = list(rel[1:]) if rel[0] == TOP else list(rel)
        return ".".join(["g2rpo", *(parts[:-1] if parts[-1] == "__init__" else parts)])

    modules = {name_of(p): p for f in FOLDERS for p in _modules(f, root)}

    def imports(name: str, path: Path) -> set[str]:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - (node.level - 1)] if node.level else []
                target = ".".join(base + (node.module.split(".") if node.module else []))
                for alias in node.names:  # a module itself, or a name from one
                    full = f"{target}.{alias.name}"
                    found.add(full if full in modules else target)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        return (found & modules.keys()) - {name}

    return {name: imports(name, path) for name, path in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module."""
    order, low, stack, cycles = {}, {}, [], []

    def visit(v: str) -> None:  # Tarjan's
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return cycles


def test_no_module_imports_itself_through_others():
    """Within a folder too: the learner core and an objective family once imported each
    other (trainer's ``merge`` one way, nft's update the other, issue 45)."""
    assert import_cycles(module_graph()) == []


def test_the_cycle_checker_finds_a_deferred_import(tmp_path):
    (tmp_path / "learner").mkdir()
    (tmp_path / "learner" / "core.py").write_text("from .family import update\n")
    (tmp_path / "learner" / "family.py").write_text("def f():\n    from .core import merge\n")
    (tmp_path / "learner" / "alone.py").write_text("from . import family\n")
    graph = module_graph(tmp_path)
    assert graph["g2rpo.learner.alone"] == {"g2rpo.learner.family"}
    assert import_cycles(graph) == [["g2rpo.learner.core", "g2rpo.learner.family"]]


# common/'s subpackages by job (issue 58): each imports only those before it here (and
# common/errors.py, common/paths.py, the only flat modules); docs/design.md says the same.
COMMON_ORDER = ["algorithms", "prompts", "config", "health", "families", "cluster", "wire"]
COMMON_FLAT = {"__init__.py", "errors.py", "paths.py"}


def common_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each subpackage of common/ → the other subpackages its modules import ("" for the
    flat modules)."""
    graph: dict[str, set[str]] = {}
    for path in _modules("common", root):
        rel = path.relative_to(root / "common").parts
        mine = rel[0] if len(rel) > 1 else ""
        package = ["common", *rel[:-1]]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
            elif (node.module or "").startswith("g2rpo.common"):
                target = node.module.split(".")[1:]
            else:
                continue
            if target[:1] == ["common"]:
                if len(target) > 1:
                    found.add(target[1] if (root / "common" / target[1]).is_dir() else "")
                else:  # from common import x: each x a subpackage or a flat module
                    found |= {
                        a.name if (root / "common" / a.name).is_dir() else "" for a in node.names
                    }
        graph.setdefault(mine, set()).update(found - {mine})
    return graph


def test_common_is_subpackages_by_job_with_only_errors_and_paths_flat():
    flat = {p.name for p in (ROOT / "common").glob("*.py")}
    assert flat == COMMON_FLAT, f"flat modules in common/: {sorted(flat - COMMON_FLAT)}"
    subs = sorted(p.name for p in (ROOT / "common").iterdir() if (p / "__init__.py").is_file())
    assert subs == sorted(COMMON_ORDER)
    for sub in subs:  # each says what lives there and what it may import
        doc = ast.get_docstring(ast.parse((ROOT / "common" / sub / "__init__.py").read_text()))
        assert doc and "import" in doc.lower(), f"common/{sub}/__init__.py: no word on its layering"


def test_common_subpackages_import_only_those_before_them():
    graph = common_graph()
    assert graph.get("", set()) <= {""}, f"common's flat modules import {graph['']}"
    wrong = {}
    for i, sub in enumerate(COMMON_ORDER):
        allowed = {"", *COMMON_ORDER[:i]}
        if graph.get(sub, set()) - allowed:
            wrong[sub] = sorted(graph[sub] - allowed)
    assert not wrong, f"common/ subpackages importing against the layering: {wrong}"


def test_the_common_layering_checker_sees_a_climbing_import(tmp_path):
    (tmp_path / "common" / "config").mkdir(parents=True)
    (tmp_path / "common" / "wire").mkdir()
    (tmp_path / "common" / "errors.py").write_text("")
    (tmp_path / "common" / "config" / "run.py").write_text(
        "def f():\n    from ..wire.messages import X\nfrom ..errors import E\n"
    )
    (tmp_path / "common" / "wire" / "messages.py").write_text(
        "from g2rpo.common.config import run\n"
    )
    graph = common_graph(tmp_path)
    assert graph == {"": set(), "config": {"wire", ""}, "wire": {"config"}}


# Files a newcomer can read in one sitting (issue 58): none over this many lines, tests
# included; split along a seam that names a job rather than grow past it.
MAX_LINES = 400


def test_no_file_is_over_the_line_limit():
    paths = [p for f in [*FOLDERS, "tests"] for p in _modules(f)]
    long = {
        str(p.relative_to(ROOT)): n
        for p in paths
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}"
