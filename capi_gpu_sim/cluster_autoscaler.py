"""The real cluster-autoscaler (1.36, clusterapi provider) as a process against a simulated world.

Why a process and not a model of it: what CA decides from our labels, taints, annotations and
ResourceSlices (its GPU processor, its DRA utilisation, its scale-from-zero template) is exactly what the
provider has to get right, and the Go module proxy does not serve its module, so nothing short of the
built binary (``hack/build-upstream.sh ca``) shows it. e2e and ``bench/scaleup.py --autoscaler ca`` run it.

The management and workload cluster are one apiserver here; CA still gets two kubeconfig files, as it
would for real: ``--cloud-config`` (management: MachineDeployments, Machines) and ``--kubeconfig``
(workload: Nodes, Pods, ResourceSlices), the latter taken from the ``<cluster>-kubeconfig`` Secret.
"""

from __future__ import annotations

import base64
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from capi_gpu.kube import CONFIGMAPS, SECRETS, Kube
from capi_gpu_sim import binaries
from capi_gpu_sim.procs import Proc

STATUS_CONFIGMAP = "cluster-autoscaler-status"
# Fast timers for a test world; the provisioning time stays a bare-metal one (the group's annotation).
FAST_TIMERS = (
    "--scan-interval=2s",
    "--scale-down-delay-after-add=15s",
    "--scale-down-delay-after-delete=0s",
    "--scale-down-delay-after-failure=10s",
    "--scale-down-unneeded-time=15s",
    "--unremovable-node-recheck-timeout=10s",
    "--new-pod-scale-up-delay=0s",
    "--max-node-provision-time=10m",
)


@dataclass(frozen=True)
class Options:
    namespace: str
    cluster: str
    state_dir: Path
    # Discovery beyond namespace and cluster, e.g. ``gpu.infrastructure.cluster.x-k8s.io/scale-owner=...``.
    discovery_extra: str = ""
    extra_args: Sequence[str] = ()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def workload_kubeconfig(kube: Kube, opts: Options) -> Path:
    """The ``<cluster>-kubeconfig`` Secret's kubeconfig as a file, as CA in a workload cluster would mount."""
    secret = kube.get(SECRETS, f"{opts.cluster}-kubeconfig", opts.namespace)
    path = opts.state_dir / "ca-workload.kubeconfig"
    path.write_bytes(base64.b64decode(secret["data"]["value"]))
    return path


class ClusterAutoscaler:
    """``ClusterAutoscaler(kube, management_kubeconfig, opts).start()``; ``stop()`` ends it."""

    def __init__(self, kube: Kube, management_kubeconfig: Path, opts: Options) -> None:
        self.kube = kube
        self.management_kubeconfig = management_kubeconfig
        self.opts = opts
        self.port = _free_port()
        self.proc: Proc | None = None
        self.started_at = 0.0

    def argv(self, binary: Path, workload: Path) -> list[str]:
        o = self.opts
        discovery = f"clusterapi:namespace={o.namespace},clusterName={o.cluster}"
        if o.discovery_extra:
            discovery += f",{o.discovery_extra}"
        return [
            str(binary),
            "--cloud-provider=clusterapi",
            f"--cloud-config={self.management_kubeconfig}",
            f"--kubeconfig={workload}",
            f"--node-group-auto-discovery={discovery}",
            "--startup-taint-prefix=readiness.k8s.io/",
            f"--namespace={o.namespace}",
            f"--status-config-map-name={STATUS_CONFIGMAP}",
            "--write-status-configmap=true",
            "--leader-elect=false",
            f"--address=127.0.0.1:{self.port}",
            "--skip-nodes-with-local-storage=false",
            "--skip-nodes-with-system-pods=false",
            "--expander=least-waste",
            "--v=4",
            *FAST_TIMERS,
            *o.extra_args,
        ]

    def start(self) -> ClusterAutoscaler:
        binary = binaries.ensure_cluster_autoscaler()
        workload = workload_kubeconfig(self.kube, self.opts)
        self.proc = Proc("cluster-autoscaler", self.argv(binary, workload), self.opts.state_dir)
        self.started_at = time.monotonic()
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    @property
    def log_path(self) -> Path:
        return self.opts.state_dir / "cluster-autoscaler.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def metrics(self) -> dict[str, float]:
        """CA's Prometheus samples, ``name{labels}`` -> value; empty while it is not serving yet."""
        try:
            text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            m = re.match(r"^(cluster_autoscaler_[a-z_]+(?:\{[^}]*\})?) (\S+)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def status(self) -> dict[str, Any]:
        """CA's status ConfigMap (1.36 writes YAML under ``status``); empty before the first loop."""
        cm = self.kube.get_or_none(CONFIGMAPS, STATUS_CONFIGMAP, self.opts.namespace)
        raw = ((cm or {}).get("data") or {}).get("status") or ""
        try:
            doc = yaml.safe_load(raw) if raw else {}
        except yaml.YAMLError:
            return {"unparsed": raw}
        return doc if isinstance(doc, dict) else {"unparsed": raw}
