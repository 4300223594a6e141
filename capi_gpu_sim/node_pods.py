"""Pods on the simulated nodes, as far as the runbooks and the readiness gate act through them: the NVIDIA DRA
kubelet plugin's pods that the chart's DaemonSet would run, and the kubelet's confirmation that a deleted pod
has stopped.

Why: the simulated kubelet (``kubelet.py``) registers Nodes and publishes the NVIDIA slices, but runs no
containers, and no DaemonSet controller runs in the simulated clusters. In a cluster the NVIDIA slices exist
only because the chart's DaemonSet ``dra-driver-nvidia-gpu-kubelet-plugin`` runs a plugin pod on the node, so
here the same DaemonSet decides, keyed off the object the chart created (by ``helm install`` through the
operator's add-ons run, or rendered from the chart archive where a world runs without add-ons):

- a node the DaemonSet fits (its template's node selector, required node affinity and tolerations against
  the node's labels and taints: ``daemonset_fit``) gets one pod with the template's labels, owned by the
  DaemonSet, bound to the node, and reported ``Running`` once the plugin publishes; it is recreated when gone
  (the DaemonSet controller's part), and a drain (CAPI's, ``kubectl drain``) skips it as it skips the real one;
- a changed pod template rolls the pods as the DaemonSet controller does, ``maxUnavailable`` nodes at a time
  (``daemonset_roll``), and the DaemonSet's status says how far the roll is; a new pod is Running and Ready
  only ``plugin_start_s`` after it was created (a real one starts its container, initialises NVML, writes
  its CDI spec and registers before its startup probe, period 1 s, passes), so a node whose plugin restarts
  is seen without one for that long, as the readiness gate sees it in a cluster;
- no DaemonSet, or a node it does not fit: no pod, and the node's kubelet publishes no NVIDIA slices
  (``SimKubelet.publish_dra`` is switched off). A plugin that goes leaves its slices behind: the kubelet
  deletes them only ``wipe_delay_s`` (30 s, the kubelet's) after the plugin went, unless a plugin
  registered again meanwhile, so consumers see slices of a node without a plugin for that long;
- the gate driver's own kubelet plugin (``config/dra/gate-plugin-daemonset.yaml``, DaemonSet
  ``kube-system/capi-gpu-gate-plugin``) gets the same treatment, a Running pod wherever its DaemonSet fits;
  it publishes nothing (the gate's slice comes from the operator), but without it a real kubelet could not
  prepare a claim's gate device, so the gate requires its pod as it requires NVIDIA's;
- ``capi-gpu nodes relayout`` restarts the plugin by deleting its pod (static MIG is read only at start): the
  deletion is confirmed after the publisher re-enumerated the GPU, and the replacement starts only then;
- a pod on a simulated node that is being deleted is removed with a zero grace period once "stopped"
  (the kubelet's part).

It polls, like the simulated kubelet, and every loop is bounded by ``stop()``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from capi_gpu import domain
from capi_gpu.kube import NODES, PODS, Kube, KubeError, NotFound, Obj, Res
from capi_gpu_sim import daemonset_fit, daemonset_roll, dra_publisher

if TYPE_CHECKING:
    from capi_gpu_sim.kubelet import SimKubelet

log = logging.getLogger(__name__)

# The chart's names (dra-driver-nvidia-gpu 0.4.1, release namespace of playbooks/addons.yml): the DaemonSet is
# "<chart name>-kubelet-plugin", its pods are selected by "<chart name>-component: kubelet-plugin".
PLUGIN_NAMESPACE = domain.NVIDIA_PLUGIN_NAMESPACE
PLUGIN_DAEMONSET = "dra-driver-nvidia-gpu-kubelet-plugin"
PLUGIN_SELECTOR = domain.NVIDIA_PLUGIN_SELECTOR
DAEMONSETS = Res("apps", "v1", "daemonsets")
GATE_PLUGIN_NAMESPACE = domain.GATE_PLUGIN_NAMESPACE
GATE_PLUGIN_DAEMONSET = "capi-gpu-gate-plugin"
GATE_PLUGIN_SELECTOR = domain.GATE_PLUGIN_SELECTOR
# The kubelet's DRA manager deletes a deregistered driver's slices of its node this long after the plugin
# went; a plugin that registers again within it (a restart) cancels the wipe.
WIPE_DELAY_S = 30.0
# From a plugin pod's creation to Running and Ready; less than a real one takes, to keep the worlds quick.
PLUGIN_START_S = 2.0


def plugin_pod(node: str, daemonset: Obj) -> Obj:
    """The pod the DaemonSet controller would create for ``node`` from the DaemonSet's template."""
    meta, template = daemonset["metadata"], daemonset["spec"]["template"]
    owner = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    labels[daemonset_roll.REVISION_LABEL] = daemonset_roll.template_hash(daemonset)
    pod_meta: dict[str, Any] = {
        "generateName": f"{meta['name']}-",
        "namespace": meta["namespace"],
        "labels": labels,
        "ownerReferences": [owner],
    }
    if annotations := (template.get("metadata") or {}).get("annotations"):
        pod_meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod_meta,
        "spec": {**copy.deepcopy(template["spec"]), "nodeName": node},
    }


class NodePods:
    """``NodePods(kube, lambda: fleet.kubelets.values()).start()``; ``stop()`` ends the loop. The kubelets should
    start with ``publish_dra=False``: this turns publishing on where the DaemonSet runs a plugin pod."""

    def __init__(
        self,
        kube: Kube,
        kubelets: Callable[[], Iterable[SimKubelet]],
        poll_s: float = 0.5,
        wipe_delay_s: float = WIPE_DELAY_S,
        plugin_start_s: float = PLUGIN_START_S,
    ) -> None:
        self.kube = kube
        self.kubelets = kubelets
        self.poll_s = poll_s
        self.wipe_delay_s = wipe_delay_s
        self.plugin_start_s = plugin_start_s
        self._started: dict[str, float] = {}
        """Plugin pod name -> when it was created here (it is Running and Ready ``plugin_start_s`` later)."""
        self.rolled: list[str] = []
        """Nodes whose old plugin pod the rolling update deleted, in order."""
        self._wipes: dict[str, tuple[float, dra_publisher.DraPublisher]] = {}
        """Node -> (when, the departed plugin's publisher): its slices are deleted then, if no plugin came back."""
        self.wiped: list[str] = []
        """Nodes whose departed plugin's slices were wiped, in order."""
        self.restarts: Counter[str] = Counter()
        """Plugin restarts per node (a relayout restarts it once)."""
        self.confirmed: list[str] = []
        """``namespace/name`` of every pod whose deletion was confirmed, in order."""
        self.misfits: dict[str, str] = {}
        """Why the DaemonSet runs no plugin pod on a node (no DaemonSet, affinity, a taint), by node."""
        self.errors: list[str] = []
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
        daemonset = self.kube.get_or_none(DAEMONSETS, PLUGIN_DAEMONSET, PLUGIN_NAMESPACE)
        if daemonset is not None and daemonset["metadata"].get("deletionTimestamp"):
            daemonset = None
        nodes = {n["metadata"]["name"]: n for n in self.kube.list(NODES)}
        pods = self.kube.list(PODS)
        running = {
            str(p["spec"]["nodeName"])
            for p in pods
            if _is_plugin(p) and p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
        }
        misfits = {name: _misfit(daemonset, nodes.get(name), name in running) for name in kubelets}
        self.misfits = {name: why for name, why in misfits.items() if why}
        for name, kubelet in kubelets.items():
            # The plugin publishes only where its pod runs; set before the kubelet's next tick starts a publisher.
            kubelet.publish_dra = name not in self.misfits
        plugin_pods: dict[str, Obj] = {}
        for pod in pods:
            meta, spec = pod["metadata"], pod.get("spec") or {}
            on = kubelets.get(spec.get("nodeName") or "")
            if on is None:
                continue
            if meta.get("deletionTimestamp"):
                self._confirm_deleted(pod, on)
            elif _is_plugin(pod):
                plugin_pods[str(spec["nodeName"])] = pod
        self._roll(daemonset, kubelets, plugin_pods)
        self._reconcile_plugin_pods(daemonset, kubelets, plugin_pods)
        self._wipe_departed(kubelets)
        self._reconcile_gate_plugin_pods(kubelets, nodes, pods)

    def _reconcile_gate_plugin_pods(
        self, kubelets: dict[str, SimKubelet], nodes: dict[str, Obj], pods: list[Obj]
    ) -> None:
        """The DaemonSet controller's part for the gate's plugin: a Running pod on every node it fits, none
        elsewhere; a deleted one is replaced once its deletion was confirmed (above)."""
        daemonset = self.kube.get_or_none(DAEMONSETS, GATE_PLUGIN_DAEMONSET, GATE_PLUGIN_NAMESPACE)
        if daemonset is not None and daemonset["metadata"].get("deletionTimestamp"):
            daemonset = None
        ours = [p for p in pods if _selected(p, GATE_PLUGIN_NAMESPACE, GATE_PLUGIN_SELECTOR)]
        holding = {(p.get("spec") or {}).get("nodeName") for p in ours}  # terminating ones too
        current = {p["spec"]["nodeName"]: p for p in ours if not p["metadata"].get("deletionTimestamp")}
        for name in kubelets:
            pod = current.get(name)
            node = nodes.get(name)
            spec = (daemonset or {}).get("spec", {}).get("template", {}).get("spec") or {}
            if daemonset is None or node is None or daemonset_fit.misfit(spec, node, running=pod is not None):
                if pod is not None:
                    self.kube.delete(PODS, pod["metadata"]["name"], GATE_PLUGIN_NAMESPACE)
                continue
            if name not in holding:
                pod = self.kube.create(PODS, plugin_pod(name, daemonset), GATE_PLUGIN_NAMESPACE)
            if pod is not None and (pod.get("status") or {}).get("phase") != "Running":
                self.kube.patch(PODS, pod["metadata"]["name"], _running(), GATE_PLUGIN_NAMESPACE, sub="status")

    def _confirm_deleted(self, pod: Obj, kubelet: SimKubelet) -> None:
        meta = pod["metadata"]
        if _is_plugin(pod) and kubelet.publisher is not None:
            if kubelet.publish_dra:  # the DaemonSet starts a new pod, which enumerates the GPU again
                try:
                    kubelet.publisher.restart()
                    self.restarts[str(kubelet.node_name)] += 1
                    log.info("node pods: NVIDIA plugin on %s restarted (re-enumerated the GPU)", kubelet.node_name)
                except dra_publisher.GpuUnavailable as exc:  # a new pod would crash-loop the same way
                    self.errors.append(f"{kubelet.node_name}: plugin restart: {exc}")
            else:
                self._plugin_gone(kubelet)
        self.kube.delete(PODS, meta["name"], meta["namespace"], grace_period_seconds=0)
        self._started.pop(meta["name"], None)
        self.confirmed.append(f"{meta['namespace']}/{meta['name']}")

    def _roll(self, daemonset: Obj | None, kubelets: dict[str, SimKubelet], pods: dict[str, Obj]) -> None:
        """The DaemonSet controller's rolling update and status write (``daemonset_roll``); a node without a
        pod here (none yet, or only a terminating one) counts as unavailable."""
        if daemonset is None:
            return
        current = daemonset_roll.template_hash(daemonset)
        view: dict[str, daemonset_roll.NodePod | None] = {}
        for name in kubelets:
            if name in self.misfits:
                continue
            pod = pods.get(name)
            view[name] = (
                None
                if pod is None
                else daemonset_roll.NodePod(
                    pod["metadata"]["name"],
                    (pod["metadata"].get("labels") or {}).get(daemonset_roll.REVISION_LABEL) == current,
                    _ready(pod),
                )
            )
        for name in daemonset_roll.to_delete(daemonset, view):
            node = next(n for n, p in view.items() if p is not None and p.name == name)
            self.kube.delete(PODS, name, PLUGIN_NAMESPACE)
            pods.pop(node, None)
            view[node] = None
            self.rolled.append(node)
            log.info("node pods: rolling update deletes %s's plugin pod %s", node, name)
        status = daemonset_roll.status(daemonset, view)
        if {k: (daemonset.get("status") or {}).get(k) for k in status} != status:
            # Deleted since this tick read it (the chart uninstalled): nothing to report, as for the controller.
            with contextlib.suppress(NotFound):
                self.kube.patch(DAEMONSETS, PLUGIN_DAEMONSET, {"status": status}, PLUGIN_NAMESPACE, sub="status")

    def _reconcile_plugin_pods(
        self, daemonset: Obj | None, kubelets: dict[str, SimKubelet], pods: dict[str, Obj]
    ) -> None:
        # A terminating pod still holds its node (it is not in ``pods``, but deleting it is confirmed above
        # first): the new one starts only after the old one's deletion was confirmed and the GPU re-enumerated,
        # never beside it, so "new pod Running" implies "restarted".
        terminating = {
            (p.get("spec") or {}).get("nodeName")
            for p in self.kube.list(PODS, PLUGIN_NAMESPACE, label_selector=PLUGIN_SELECTOR)
            if p["metadata"].get("deletionTimestamp")
        }
        for name, kubelet in kubelets.items():
            pod = pods.get(name)
            if name in self.misfits:
                if pod is not None:  # the DaemonSet controller (or, once the DaemonSet is gone, the GC) deletes it
                    self.kube.delete(PODS, pod["metadata"]["name"], PLUGIN_NAMESPACE)
                elif kubelet.publisher is not None and name not in terminating:
                    self._plugin_gone(kubelet)
                continue
            assert daemonset is not None
            if pod is None and name not in terminating:
                pod = self.kube.create(PODS, plugin_pod(name, daemonset), PLUGIN_NAMESPACE)
                self._started[pod["metadata"]["name"]] = time.monotonic() + self.plugin_start_s
            if (
                pod is not None
                and kubelet.publisher is not None
                and (pod.get("status") or {}).get("phase") != "Running"
                and time.monotonic() >= self._started.get(pod["metadata"]["name"], 0.0)
            ):
                self.kube.patch(PODS, pod["metadata"]["name"], _running(), PLUGIN_NAMESPACE, sub="status")
                self._started.pop(pod["metadata"]["name"], None)

    def _plugin_gone(self, kubelet: SimKubelet) -> None:
        """The plugin stopped and nothing replaces it (``publish_dra`` is already off): its slices stay until
        the kubelet's wipe delay ends."""
        publisher, kubelet.publisher = kubelet.publisher, None
        if publisher is not None and kubelet.node_name:
            self._wipes[str(kubelet.node_name)] = (time.monotonic() + self.wipe_delay_s, publisher)
            log.info(
                "node pods: no NVIDIA plugin on %s (%s); its slices go in %.0fs",
                kubelet.node_name,
                self.misfits.get(str(kubelet.node_name)),
                self.wipe_delay_s,
            )

    def _wipe_departed(self, kubelets: dict[str, SimKubelet]) -> None:
        now = time.monotonic()
        for name, (due, publisher) in list(self._wipes.items()):
            kubelet = kubelets.get(name)
            if kubelet is None or kubelet.publisher is not None:
                del self._wipes[name]  # a plugin registered again (and republished): nothing to wipe
            elif now >= due:
                del self._wipes[name]
                publisher.stop()
                self.wiped.append(name)
                log.info("node pods: the kubelet wiped %s's NVIDIA slices (plugin gone %.0fs)", name, self.wipe_delay_s)


def _misfit(daemonset: Obj | None, node: Obj | None, running: bool) -> str | None:
    if daemonset is None:
        return f"no DaemonSet {PLUGIN_NAMESPACE}/{PLUGIN_DAEMONSET}"
    if node is None:
        return "no Node"
    return daemonset_fit.misfit(daemonset["spec"]["template"].get("spec") or {}, node, running=running)


def _is_plugin(pod: Obj) -> bool:
    return _selected(pod, PLUGIN_NAMESPACE, PLUGIN_SELECTOR)


def _selected(pod: Obj, namespace: str, selector: str) -> bool:
    """``selector``: one key=value, as the plugins' selectors are."""
    key, _, value = selector.partition("=")
    meta = pod["metadata"]
    return meta.get("namespace") == namespace and (meta.get("labels") or {}).get(key) == value


def _ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _running() -> dict[str, Any]:
    return {
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}],
        }
    }
