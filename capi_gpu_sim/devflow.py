"""`make dev`'s story, step by step: scale the GPU MachineDeployment, submit a pod with a 1g.24gb claim,
show each host's progress from its status and Events, and summarise where the time and Robot calls went.

Kept apart from the CLI so the e2e suite runs the same flow and asserts on the same summary.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capi_gpu.kube import CAPI_MACHINEDEPLOYMENTS, CAPI_MACHINES, EVENTS, NODES, PODS, Kube, ours
from capi_gpu_sim.world import World

HOSTS = ours("hetznergpuhosts")
TEMPLATES = ours("hetznergpumachinetemplates")
CLAIM_TEMPLATE = "mig-1g-24gb"


def claim_pod(name: str, template: str = CLAIM_TEMPLATE) -> dict[str, Any]:
    """A pod asking for one MIG slice through the shipped template (MIG request + gate request)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "mig-demo"}},
        "spec": {
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.9.0-base-ubuntu24.04",
                    "command": ["nvidia-smi", "-L"],
                    "resources": {"claims": [{"name": "mig"}]},
                }
            ],
            "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": template}],
        },
    }


@dataclass
class Row:
    host: str
    state: str
    step: str
    consumer: str
    node: str
    gpu_ready: str


@dataclass
class Summary:
    seconds: float
    steps: dict[str, list[float]] = field(default_factory=dict)
    robot_calls: dict[str, int] = field(default_factory=dict)
    where: list[Row] = field(default_factory=list)
    pod_node: str | None = None

    def lines(self) -> list[str]:
        out = [f"claim bound after {self.seconds:.0f}s; pod on node {self.pod_node}", "", "time per step:"]
        for step, took in sorted(self.steps.items(), key=lambda kv: -sum(kv[1])):
            out.append(f"  {step:<14} n={len(took):<2} mean {sum(took) / len(took):6.1f}s  max {max(took):6.1f}s")
        total = sum(self.robot_calls.values())
        out += ["", f"Robot calls: {total}"]
        out += [f"  {k:<40} {v}" for k, v in sorted(self.robot_calls.items())]
        out += ["", "what is where:", f"  {'HOST':<18} {'STATE':<14} {'MACHINE':<24} {'NODE':<18} GPUReady"]
        out += [f"  {r.host:<18} {r.state:<14} {r.consumer:<24} {r.node:<18} {r.gpu_ready}" for r in self.where]
        return out


def rows(k: Kube, ns: str) -> list[Row]:
    nodes = {n["metadata"]["name"]: n for n in k.list(NODES)}
    out = []
    for h in k.list(HOSTS, ns):
        st, name = h.get("status") or {}, h["metadata"]["name"]
        node = nodes.get(name)
        ready = next(
            (c["status"] for c in (node or {}).get("status", {}).get("conditions", []) if c["type"] == "GPUReady"), "-"
        )
        out.append(
            Row(
                name,
                st.get("state", "-"),
                st.get("step") or "-",
                (h["spec"].get("consumerRef") or {}).get("name", "-"),
                name if node else "-",
                ready,
            )
        )
    return out


_DONE = re.compile(r"^(\w+) took ([0-9.]+)s$")


def summarise(world: World, started: float, pod_node: str | None) -> Summary:
    k, ns = world.k, world.config.namespace
    steps: dict[str, list[float]] = {}
    for ev in k.list(EVENTS, ns):
        if ev.get("involvedObject", {}).get("kind") == "HetznerGPUHost" and (m := _DONE.match(ev.get("message", ""))):
            steps.setdefault(m.group(1), []).append(float(m.group(2)))
    calls: Counter[str] = Counter()
    assert world.robot is not None
    for entry in world.robot.log:
        path = re.sub(r"/key/[0-9a-f:]+", "/key/{fingerprint}", re.sub(r"/\d+", "/{n}", entry.path.split("?")[0]))
        calls[f"{entry.method} {path}"] += 1
    return Summary(time.monotonic() - started, steps, dict(calls), rows(k, ns), pod_node)


def run(
    world: World,
    replicas: int,
    pod: str = "mig-demo",
    progress: Any = None,
    timeout: float = 900,
    tick: Callable[[], None] | None = None,
    md: str | None = None,
) -> Summary:
    """Scale, submit the pod, wait until the scheduler bound it; ``progress(rows)`` is called on changes,
    ``tick()`` once a second (a live view redraws the time in step); ``md``: another MachineDeployment than the
    world's own."""
    k, ns = world.k, world.config.namespace
    started = time.monotonic()
    world.scale(replicas, md)
    k.apply(PODS, claim_pod(pod), ns)
    last: list[Row] = []
    deadline = started + timeout
    while time.monotonic() < deadline:
        current = rows(k, ns)
        if progress is not None and current != last:
            progress(current)
            last = current
        if tick is not None:
            tick()
        node = (k.get(PODS, pod, ns).get("spec") or {}).get("nodeName")
        if node:
            return summarise(world, started, node)
        failure = world.operator_failure()
        if failure is not None:
            raise RuntimeError(failure)
        time.sleep(1.0)
    raise TimeoutError(
        f"pod {pod} not bound after {timeout:.0f}s; machines: "
        f"{[m['metadata']['name'] for m in k.list(CAPI_MACHINES, ns)]}"
    )


def image_deployment(world: World, name: str, image: dict[str, str]) -> str:
    """A second GPU MachineDeployment, 0 replicas, whose new template is the world's own plus ``image``
    (``spec.image``: templates are immutable, so a user rolls onto an image this way too); returns its name."""
    k, ns, own = world.k, world.config.namespace, f"{world.config.cluster}-gpu"

    def fresh(obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"] = {"name": name, "labels": obj["metadata"].get("labels") or {}}
        obj.pop("status", None)
        return obj

    template = fresh(k.get(TEMPLATES, own, ns))
    template["spec"]["template"]["spec"]["image"] = image
    template["spec"].pop("standby", None)
    k.create(TEMPLATES, template, ns)
    md = fresh(k.get(CAPI_MACHINEDEPLOYMENTS, own, ns))
    spec = md["spec"]
    spec["replicas"] = 0
    spec["selector"]["matchLabels"]["cluster.x-k8s.io/deployment-name"] = name
    spec["template"]["metadata"]["labels"]["cluster.x-k8s.io/deployment-name"] = name
    spec["template"]["spec"]["infrastructureRef"]["name"] = name
    k.create(CAPI_MACHINEDEPLOYMENTS, md, ns)
    return name


def bake_cli(world: World, host: str, out: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``capi-gpu image bake HOST --to OUT`` as a user runs it, against the world's apiserver."""
    cmd = ["-m", "capi_gpu.cli", "image", "bake", host, "--to", str(out), "-n", world.config.namespace]
    return subprocess.run(
        [sys.executable, *cmd, "--kubeconfig", str(world.cp.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
