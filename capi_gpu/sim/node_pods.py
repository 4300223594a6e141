"""Pods on the simulated nodes, as far as the runbooks act through them: the NVIDIA DRA kubelet plugin's
pod, and the kubelet's confirmation that a deleted pod has stopped.

Why: the simulated kubelet (``kubelet.py``) registers Nodes and publishes the NVIDIA slices, but runs no
containers, and two operations work through pods. ``capi-gpu nodes relayout`` restarts the NVIDIA plugin
by deleting its pod on the node (the chart's DaemonSet starts a new one, which enumerates the GPU again:
static MIG is read only at start), and a drain (relayout's NoExecute DeviceTaintRule evicting through
kube-controller-manager, CAPI's drain) deletes pods and waits until they are gone. With nothing on the
node to confirm a deletion, a pod bound to a node would stay ``Terminating`` forever. So, for every
simulated node whose plugin publishes:

- one pod in ``nvidia-dra-driver-gpu`` with the chart's ``app.kubernetes.io/name`` label, bound to the node,
  reported ``Running`` and recreated when it is gone (the DaemonSet controller's part). It is owned by a
  DaemonSet object of that name (which no controller here reconciles), so a drain (CAPI's, ``kubectl
  drain``) skips it as it skips the real plugin;
- a pod on a simulated node that is being deleted is removed with a zero grace period once "stopped"
  (the kubelet's part); the plugin's own pod re-enumerates the GPU first (``DraPublisher.restart``).

It polls, like the simulated kubelet, and every loop is bounded by ``stop()``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from capi_gpu import domain
from capi_gpu.kube import NAMESPACES, PODS, Conflict, Kube, KubeError, Obj, Res
from capi_gpu.sim import dra_publisher

if TYPE_CHECKING:
    from capi_gpu.sim.kubelet import SimKubelet

log = logging.getLogger(__name__)

PLUGIN_NAMESPACE = "nvidia-dra-driver-gpu"
PLUGIN_DAEMONSET = "nvidia-dra-driver-gpu-kubelet-plugin"
DAEMONSETS = Res("apps", "v1", "daemonsets")
PLUGIN_LABELS = {
    "app.kubernetes.io/name": "dra-driver-nvidia-gpu",
    "app.kubernetes.io/component": "kubelet-plugin",
}
PLUGIN_SELECTOR = ",".join(f"{k}={v}" for k, v in PLUGIN_LABELS.items())


def _pod_spec() -> dict[str, Any]:
    return {
        "tolerations": [
            {"key": domain.NODE_STARTUP_TAINT, "operator": "Exists"},
            {"key": domain.NVIDIA_GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
        ],
        "containers": [{"name": "gpus", "image": "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.0"}],
    }


def plugin_daemonset() -> Obj:
    """The chart's kubelet plugin DaemonSet, as the owner of its pods (no DaemonSet controller runs here)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": PLUGIN_DAEMONSET, "namespace": PLUGIN_NAMESPACE, "labels": dict(PLUGIN_LABELS)},
        "spec": {
            "selector": {"matchLabels": dict(PLUGIN_LABELS)},
            "template": {"metadata": {"labels": dict(PLUGIN_LABELS)}, "spec": _pod_spec()},
        },
    }


def plugin_pod(node: str, daemonset_uid: str) -> Obj:
    """The kubelet plugin pod the DaemonSet would run on ``node`` (nothing runs it here)."""
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": PLUGIN_DAEMONSET, "uid": daemonset_uid}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{PLUGIN_DAEMONSET}-",
            "namespace": PLUGIN_NAMESPACE,
            "labels": dict(PLUGIN_LABELS),
            "ownerReferences": [{**owner, "controller": True}],
        },
        "spec": {"nodeName": node, **_pod_spec()},
    }


class NodePods:
    """``NodePods(kube, lambda: fleet.kubelets.values()).start()``; ``stop()`` ends the loop."""

    def __init__(self, kube: Kube, kubelets: Callable[[], Iterable[SimKubelet]], poll_s: float = 0.5) -> None:
        self.kube = kube
        self.kubelets = kubelets
        self.poll_s = poll_s
        self.restarts: Counter[str] = Counter()
        """Plugin restarts per node (a relayout restarts it once)."""
        self.confirmed: list[str] = []
        """``namespace/name`` of every pod whose deletion was confirmed, in order."""
        self.errors: list[str] = []
        self._daemonset_uid: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-node-pods", daemon=True)

    def start(self) -> NodePods:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._tick()
            except (KubeError, OSError) as exc:  # the apiserver may be restarting; keep going until stop()
                self.errors.append(f"{type(exc).__name__}: {exc}")
                log.debug("node pods: %s", exc)

    def _tick(self) -> None:
        kubelets = {str(k.node_name): k for k in self.kubelets() if k.node_name}
        if not kubelets:
            return
        for pod in self.kube.list(PODS):
            meta, spec = pod["metadata"], pod.get("spec") or {}
            kubelet = kubelets.get(spec.get("nodeName") or "")
            if kubelet is not None and meta.get("deletionTimestamp"):
                self._confirm_deleted(pod, kubelet)
        publishing = {name: k for name, k in kubelets.items() if k.publisher is not None}
        if publishing:
            self._ensure_plugin_pods(publishing)

    def _confirm_deleted(self, pod: Obj, kubelet: SimKubelet) -> None:
        meta = pod["metadata"]
        if meta.get("namespace") == PLUGIN_NAMESPACE and _is_plugin(pod) and kubelet.publisher is not None:
            try:
                kubelet.publisher.restart()
                self.restarts[str(kubelet.node_name)] += 1
                log.info("node pods: NVIDIA plugin on %s restarted (re-enumerated the GPU)", kubelet.node_name)
            except dra_publisher.GpuUnavailable as exc:  # a new pod would crash-loop the same way
                self.errors.append(f"{kubelet.node_name}: plugin restart: {exc}")
        self.kube.delete(PODS, meta["name"], meta["namespace"], grace_period_seconds=0)
        self.confirmed.append(f"{meta['namespace']}/{meta['name']}")

    def _ensure_plugin_pods(self, publishing: dict[str, SimKubelet]) -> None:
        uid = self._daemonset_uid or self._ensure_daemonset()
        # A terminating pod still holds its node: the new one starts only after the old one's deletion was
        # confirmed (and the GPU re-enumerated), never beside it, so "new pod Running" implies "restarted".
        running = {
            (p.get("spec") or {}).get("nodeName")
            for p in self.kube.list(PODS, PLUGIN_NAMESPACE, label_selector=PLUGIN_SELECTOR)
        }
        for node in publishing:
            if node in running:
                continue
            created = self.kube.create(PODS, plugin_pod(node, uid), PLUGIN_NAMESPACE)
            self.kube.patch(PODS, created["metadata"]["name"], _running(), PLUGIN_NAMESPACE, sub="status")

    def _ensure_daemonset(self) -> str:
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PLUGIN_NAMESPACE}}
        with contextlib.suppress(Conflict):
            self.kube.create(NAMESPACES, namespace)
        with contextlib.suppress(Conflict):
            self.kube.create(DAEMONSETS, plugin_daemonset(), PLUGIN_NAMESPACE)
        self._daemonset_uid = str(self.kube.get(DAEMONSETS, PLUGIN_DAEMONSET, PLUGIN_NAMESPACE)["metadata"]["uid"])
        return self._daemonset_uid


def _is_plugin(pod: Obj) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in PLUGIN_LABELS.items())


def _running() -> dict[str, Any]:
    return {
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}],
        }
    }
