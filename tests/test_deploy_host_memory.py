"""The KubeRay pods, as each overlay renders them, hold the host memory `g2rpo plan`
says each node of the train-config's recipe needs (issue 55): every Ray pod's memory
limit at or above its node's host RAM at its peak phase, its /dev/shm at or above the
node's object store and NCCL's segments, its object-store-memory at or above what the
node puts there. The plan's nodes map onto pods by GPUs: its head onto the head pod,
every other node onto the worker group with the fewest GPUs that still holds the node's
(base/gpu: flux_hps's learner node and two worker nodes onto the gpu8 pods, its reward
node onto the gpu1 pod; cpu: the tiny world's node onto the cpu pod). Before issue 55
the pods were sized by a comment's arithmetic, never held to the plan."""

import math

import pytest
from deploy_render import RENDERS, _clusters, _gpus, _job_config, _quantity, _ray_pods, _rendered
from g2rpo.planning.host_nodes import host_plan

GiB = 2**30


def _pod_for(node, pods):
    """(where, template, rayStartParams) of the pod that hosts a plan's node."""
    head, workers = pods[0], pods[1:]
    if node.head:
        return head[:3]
    need = math.ceil(node.gpus - 1e-9)
    fitting = [p for p in workers if _gpus(p[1]) >= need]
    assert fitting, f"{node.name} needs {need} GPUs: no worker group holds them"
    return min(fitting, key=lambda p: _gpus(p[1]))[:3]


@pytest.mark.parametrize("render", RENDERS)
def test_every_ray_pod_holds_its_nodes_host_memory(render):
    docs = _rendered(render)
    cfg, *_ = _job_config(docs)
    problems = []
    for key, spec in _clusters(docs):
        pods = _ray_pods(spec)
        per_node = max([_gpus(p[1]) for p in pods[1:]] + [1])
        for node in host_plan(cfg, per_node):
            where, template, params = _pod_for(node, pods)
            pod = template["spec"]
            container = pod["containers"][0]
            limit = _quantity(container["resources"]["limits"]["memory"])
            if limit < node.peak:
                problems.append(
                    f"{key} {where}: memory limit {limit / GiB:.0f} GiB under {node.name}'s "
                    f"host RAM at {node.peak_phase}, {node.peak / GiB:.1f} GiB: "
                    f"needs {math.ceil(node.peak / GiB)}Gi"
                )
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            volumes = {v["name"]: v for v in pod["volumes"]}
            shm = volumes.get(mounts.get("/dev/shm"), {}).get("emptyDir", {})
            size = _quantity(shm.get("sizeLimit", 0))
            if size < node.shm_bytes:
                problems.append(
                    f"{key} {where}: /dev/shm {size / GiB:.1f} GiB under {node.name}'s "
                    f"{node.shm_bytes / GiB:.1f} GiB"
                )
            store = int(params.get("object-store-memory", 0))
            if store < node.store_bytes:
                problems.append(
                    f"{key} {where}: object-store-memory {store / GiB:.1f} GiB under "
                    f"{node.name}'s {node.store_bytes / GiB:.1f} GiB"
                )
    assert not problems, "\n".join(problems)
