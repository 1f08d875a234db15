"""The run directory's contract: one filesystem, mounted at the same absolute path, for
the driver and every node that runs a learner rank, a rollout worker or the evaluator.

The learner ranks write the checkpoints (each rank its shards) and the final export
there, and the driver lists, prunes, renames and resumes from them: a run directory
that is node-local on some node loses checkpoints the driver never sees, and a resume
that finds none would start over. So before any model loads, a probe runs on each of
those nodes (a Ray task pinned to the node, in the same filesystem view as the
actors there) and writes a file into the run directory; the driver must see every
one, or the run stops naming ``run.output_dir`` and the nodes that did not reach it.
After every checkpoint the driver checks again that it sees the checkpoint whole
(``TrainingLoop.checkpoint``)."""

from __future__ import annotations

import uuid
from pathlib import Path

import ray

from ..common.errors import RunFailed

PROBES = ".probes"


@ray.remote(num_cpus=0, max_retries=0)
def _write_probe(directory: str, name: str) -> dict:
    """On one node: write ``directory/name``; say where, or why not."""
    ip = ray.util.get_node_ip_address()
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / name).write_text(f"{ip}\n")
    except OSError as exc:
        return {"ip": ip, "error": f"{type(exc).__name__}: {exc}"}
    return {"ip": ip, "error": None}


def probe_nodes(run_dir: Path, actors_by_node: dict[str, list[str]], timeout_s: float) -> None:
    """Each node of ``actors_by_node`` (node id → the actors it runs, by name) writes a
    probe into ``run_dir``; RunFailed unless the driver sees all of them."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    directory = run_dir / PROBES
    tag = uuid.uuid4().hex[:8]
    names = {node: f"{tag}-{node[:12]}" for node in actors_by_node}
    refs = {
        node: _write_probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
        ).remote(str(directory), names[node])
        for node in actors_by_node
    }
    answers = dict(zip(refs, ray.get(list(refs.values()), timeout=timeout_s), strict=True))
    unwritable, unseen = [], []
    for node, answer in answers.items():
        who = f"{', '.join(actors_by_node[node])} (node {answer['ip']})"
        if answer["error"] is not None:
            unwritable.append(f"{who}: {answer['error']}")
        elif not (directory / names[node]).is_file():
            unseen.append(who)
    for name in names.values():
        (directory / name).unlink(missing_ok=True)
    if not unwritable and not unseen:
        return
    problems = []
    if unseen:
        problems.append("the driver does not see the files written there by " + "; ".join(unseen))
    if unwritable:
        problems.append("it cannot be written from " + "; ".join(unwritable))
    raise RunFailed(
        f"run.output_dir: the run directory {run_dir} is not one filesystem for the whole "
        f"run: {' and '.join(problems)}. The learner ranks write checkpoints and the final "
        "export there and the driver reads them: mount one filesystem (NFS, a "
        "ReadWriteMany volume) at the same path on the driver's node and every GPU node, "
        "and point run.output_dir at it (README, 'What the cluster must provide')"
    )


def nodes_of(groups: list[tuple[str, list[dict]]]) -> dict[str, list[str]]:
    """node id → actor names, from (kind, each actor's ``placement()`` answer)."""
    out: dict[str, list[str]] = {}
    for kind, placed in groups:
        for i, info in enumerate(placed):
            name = kind if len(placed) == 1 and kind == "evaluator" else f"{kind} {i}"
            out.setdefault(info["node_id"], []).append(name)
    return out
