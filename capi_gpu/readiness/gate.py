"""The per-Cluster readiness gate: watches the workload cluster, decides with ``decisions``, writes.

One daemon per HetznerGPUCluster reaches the workload cluster through ``<cluster>-kubeconfig`` with its
own client (a kopf operator holds one cluster's credentials) and watches Nodes, ResourceSlices and
ResourceClaims through informers: no polling loop. Each batch of changes re-evaluates only the nodes and
claims it touched. The three layers:

* node: the ``GPUReady`` condition and the ``readiness.k8s.io/gpu-not-ready`` startup taint; GPU-ready needs
  the NVIDIA slices to match the layout and, for each ``PluginCheck`` given (the operator gives NVIDIA's
  plugin and the gate's own), a kubelet-plugin pod Running on the node (one informer each, on those pods);
* Machine: the ``GPUReady`` condition, server-side applied so CAPI's own conditions are untouched, and
  never on a paused Machine or Cluster (``runtime.pause``): the pause is asked right before each write,
  and a paused Cluster ends the gate (its supervisor starts a fresh one on resume), so the source of a
  clusterctl move is not written in the up to 30 s the supervisor takes to notice;
* claim: our gate ResourceSlice per GPU node, and the gate device's binding condition on allocated claims.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any

from capi_gpu import domain
from capi_gpu.kube import (
    CAPI_CLUSTERS,
    CAPI_MACHINES,
    NODES,
    PODS,
    RESOURCECLAIMS,
    RESOURCESLICES,
    AsyncKube,
    Conflict,
    Invalid,
    KubeError,
    NotFound,
    Obj,
)
from capi_gpu.readiness import decisions, targets
from capi_gpu.readiness.informer import Change, Feed
from capi_gpu.runtime import metrics, pause
from capi_gpu.runtime.deps import Deps

log = logging.getLogger(__name__)
MANAGER = "capi-gpu-gate"
TARGET_TTL = 5.0
RESYNC = 30.0  # re-evaluate every node from cache this often, or when the management side changed
LATENCY_SAMPLES = 4096
NODE_RETRY = 5.0


class ClusterGate:
    def __init__(
        self,
        deps: Deps,
        namespace: str,
        cluster: str,
        workload: AsyncKube,
        plugins: tuple[decisions.PluginCheck, ...] = (),
        infra_cluster: str | None = None,
    ) -> None:
        """``infra_cluster``: the HetznerGPUCluster ``plugins`` were read from; ``run`` returns (so the
        supervisor starts a gate with the new checks) when they change."""
        self.deps, self.namespace, self.cluster, self.wl = deps, namespace, cluster, workload
        self.plugins, self.infra_cluster = plugins, infra_cluster
        self.nodes: dict[str, Obj] = {}
        self.slices: dict[str, Obj] = {}
        # Per plugin check: its pods, and their keys by nodeName.
        self.plugin_pods: list[dict[tuple[str, str], Obj]] = [{} for _ in plugins]
        self._plugin_pods_on = [collections.defaultdict[str, set[tuple[str, str]]](set) for _ in plugins]
        self.claims: dict[tuple[str, str], Obj] = {}
        self.verdicts: dict[str, decisions.PoolVerdict] = {}
        self.slice_seen: dict[str, float] = {}
        # Recent figures only (bench and debugging read them; the histograms are the long-term record).
        self.latencies: collections.deque[float] = collections.deque(maxlen=LATENCY_SAMPLES)
        """Seconds from the informer seeing the driver's slice to the startup taint removed."""
        self._targets: dict[str, targets.GpuTarget] = {}
        self._targets_at = 0.0
        self._synced: set[str] = set()
        self._recheck: dict[tuple[str, str], float] = {}
        self._waiting: set[tuple[str, str]] = set()  # claims decided WAIT: held in the scheduler's PreBind
        self._allocated_seen: dict[tuple[str, str], float] = {}
        self._node_retry: dict[str, float] = {}
        self._not_targets: set[str] = set()
        self._kinds = 3  # informers whose first list must be in before anything is decided
        # When each node's verdict last turned not ready (monotonic): claims the gate saw allocated before
        # it were placed on a ready GPU and keep their gate devices NoSchedule, the rest become NoExecute.
        self._not_ready_since: dict[str, float] = {}
        self.claim_latencies: collections.deque[float] = collections.deque(maxlen=LATENCY_SAMPLES)
        """Seconds from the informer seeing a claim's gate allocation to our binding condition written."""
        self.cluster_paused = False
        """A Machine write found the Cluster paused: ``run`` returns after the batch."""

    async def run(self, stopped: Any) -> None:
        feed = Feed(self.wl.sync)
        for res, kind in ((NODES, "node"), (RESOURCESLICES, "slice"), (RESOURCECLAIMS, "claim")):
            feed.watch(res, kind)
        for i, check in enumerate(self.plugins):
            feed.watch(PODS, f"pod:{i}", check.selector, None, check.namespace)
        self._kinds = len(feed.informers)
        # The management side wakes us too: a machine that just got its providerID makes a node ours.
        mgmt_wake = self.deps.wakeups.event("gate", self.namespace, self.cluster)
        try:
            while not stopped:
                wake = min([*self._recheck.values(), *self._node_retry.values()], default=time.monotonic() + RESYNC)
                timeout = max(0.05, wake - time.monotonic())
                getter = asyncio.ensure_future(feed.queue.get())
                woken = asyncio.ensure_future(mgmt_wake.wait())
                try:
                    done, _ = await asyncio.wait(
                        {getter, woken}, timeout=min(timeout, RESYNC), return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    pending = [f for f in (getter, woken) if not f.done()]
                    for fut in pending:
                        fut.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
                batch = [getter.result()] if getter in done else []
                while not feed.queue.empty():
                    batch.append(feed.queue.get_nowait())
                resync = woken in done or not done
                if resync:
                    mgmt_wake.clear()
                    self._targets_at = 0.0  # reload: which machines (and so nodes) are ours may have changed
                    if await self._plugin_check_changed():
                        return
                await self.process(batch, resync=resync)
                if self.cluster_paused:
                    log.info("gate %s/%s: Cluster paused; stopping until it is resumed", self.namespace, self.cluster)
                    return
        finally:
            feed.stop()

    def _apply(self, ch: Change) -> tuple[set[str], set[tuple[str, str]]]:
        nodes: set[str] = set()
        claims: set[tuple[str, str]] = set()
        if ch.type == "SYNCED":
            self._synced.add(ch.kind)
            return set(self.nodes), set(self.claims)
        meta = ch.obj.get("metadata", {})
        if ch.kind == "node":
            name = meta["name"]
            if ch.type == "DELETED":
                self.nodes.pop(name, None)
            else:
                self.nodes[name] = ch.obj
            nodes.add(name)
        elif ch.kind.startswith("pod:"):
            nodes |= self._apply_plugin_pod(int(ch.kind[4:]), ch)
        elif ch.kind == "slice":
            spec = ch.obj.get("spec", {})
            node = spec.get("nodeName") or spec.get("pool", {}).get("name", "")
            if ch.type == "DELETED":
                self.slices.pop(meta["name"], None)
            else:
                self.slices[meta["name"]] = ch.obj
            if spec.get("driver") == domain.NVIDIA_DRIVER:
                self.slice_seen[node] = ch.seen
                nodes.add(node)
            elif spec.get("driver") == domain.GATE_DRIVER and ch.type == "DELETED":
                # The kubelet deletes a node's slices when it starts and 30 s after a plugin went away: put
                # ours back now, not at the next resync, or pods wait for a gate device that isn't there.
                nodes.add(node)
        else:
            key = (meta.get("namespace", ""), meta["name"])
            if ch.type == "DELETED":
                self.claims.pop(key, None)
                self._allocated_seen.pop(key, None)
            else:
                self.claims[key] = ch.obj
                claims.add(key)
                if _gate_node(ch.obj) is None:
                    self._allocated_seen.pop(key, None)  # deallocated: a new allocation starts a new clock
                else:
                    self._allocated_seen.setdefault(key, ch.seen)
        return nodes, claims

    def _apply_plugin_pod(self, check: int, ch: Change) -> set[str]:
        """The nodes the change concerns: where the pod was and where it is."""
        meta = ch.obj.get("metadata", {})
        key = (meta.get("namespace", ""), meta["name"])
        pods, on = self.plugin_pods[check], self._plugin_pods_on[check]
        nodes = set()
        before = pods.pop(key, None)
        if before is not None:  # a pod is bound once, but it may have been seen before it was
            nodes.add(_node_of(before))
            on[_node_of(before)].discard(key)
        if ch.type != "DELETED":
            pods[key] = ch.obj
            on[_node_of(ch.obj)].add(key)
            nodes.add(_node_of(ch.obj))
        return nodes

    async def process(self, batch: list[Change], resync: bool = False) -> None:
        dirty_nodes: set[str] = set()
        dirty_claims: set[tuple[str, str]] = set()
        for ch in batch:
            n, c = self._apply(ch)
            dirty_nodes |= n
            dirty_claims |= c
        now = time.monotonic()
        due = {k for k, t in self._recheck.items() if t <= now}
        retry = {n for n, t in self._node_retry.items() if t <= now}
        if len(self._synced) < self._kinds:
            return
        for name in retry:
            del self._node_retry[name]
        if resync:
            self._not_targets.clear()
            dirty_nodes |= set(self.nodes)
        changed_verdicts = await self.evaluate_nodes(dirty_nodes | retry)
        # A node verdict change can settle claims waiting on it.
        touched = {k for k, c in self.claims.items() if _gate_node(c) in changed_verdicts}
        await self.gate_claims(dirty_claims | due | touched)

    async def _plugin_check_changed(self) -> bool:
        if self.infra_cluster is None:
            return False
        try:
            checks = await targets.plugin_checks(self.deps.kube, self.namespace, self.infra_cluster)
        except KubeError as exc:
            log.warning("gate %s/%s: reading the plugin checks: %s", self.namespace, self.cluster, exc)
            return False
        if checks == self.plugins:
            return False
        log.info("gate %s/%s: kubelet plugin checks now %s; restarting", self.namespace, self.cluster, checks)
        return True

    async def _gpu_targets(self, force: bool = False) -> dict[str, targets.GpuTarget]:
        if force or time.monotonic() - self._targets_at > TARGET_TTL:
            if not force:
                self._not_targets.clear()
            self._targets = await targets.load(self.deps.kube, self.namespace, self.cluster)
            self._targets_at = time.monotonic()
        return self._targets

    async def evaluate_nodes(self, names: set[str]) -> set[str]:
        changed: set[str] = set()
        if not names:
            return changed
        tgts = await self._gpu_targets()
        unknown = {
            pid
            for n in names
            if (pid := self.nodes.get(n, {}).get("spec", {}).get("providerID", "")).startswith(
                domain.PROVIDER_ID_PREFIX
            )
            and pid not in tgts
        } - self._not_targets
        if unknown:
            tgts = await self._gpu_targets(force=True)  # a node joined before our cache saw its machine
            # Robot nodes that are not GPU targets (control plane, dynamic MIG) would otherwise force a
            # reload on every one of their events; they are looked at again with the next regular reload.
            self._not_targets |= unknown - tgts.keys()
        # Nodes are independent and each takes up to four writes: a burst of pools (a fleet-wide driver
        # restart) must not queue the last node behind all the others' round trips.
        ordered = sorted(names)
        results = await asyncio.gather(*(self._evaluate_node(name, tgts) for name in ordered))
        return {name for name, flipped in zip(ordered, results, strict=True) if flipped}

    async def _evaluate_node(self, name: str, tgts: dict[str, targets.GpuTarget]) -> bool:
        """Decide one node and write its three layers; True when its verdict changed."""
        node = self.nodes.get(name)
        if node is None:
            self.verdicts.pop(name, None)
            return False
        target = tgts.get(node.get("spec", {}).get("providerID", ""))
        if target is None:
            return False
        verdict = decisions.pool_verdict(self.slices.values(), name, target.expected, self._plugin_problem(name))
        before = self.verdicts.get(name)
        self.verdicts[name] = verdict
        if verdict.ready:
            self._not_ready_since.pop(name, None)
        else:
            self._not_ready_since.setdefault(name, time.monotonic())
        try:
            if not await self._write_node(node, verdict):
                # The node went while we decided: forget it, and write no gate slice or Machine for a ghost.
                self.nodes.pop(name, None)
                self.verdicts.pop(name, None)
                return False
            await self._write_gate_slice(node, verdict, decisions.gate_device_count(target.expected))
            if (
                target.capi_machine
                and (before is None or before.ready != verdict.ready or before.reason != verdict.reason)
                and not await self._write_machine(target.capi_machine, verdict)
            ):
                self.verdicts.pop(name, None)  # held back by a pause: written on a later pass
        except KubeError as exc:
            # Nothing may change on the node to bring us back: forget the verdict, so every layer is
            # written again, and retry shortly.
            log.warning("node %s: gate write failed: %s; retrying in %.0fs", name, exc, NODE_RETRY)
            self.verdicts.pop(name, None)
            self._node_retry[name] = time.monotonic() + NODE_RETRY
        return before is None or before.reason != verdict.reason or before.message != verdict.message

    def _plugin_problem(self, node: str) -> str | None:
        problems = []
        for check, pods, on in zip(self.plugins, self.plugin_pods, self._plugin_pods_on, strict=True):
            problem = decisions.plugin_problem([pods[k] for k in on.get(node, ())], node, check)
            if problem is not None:
                problems.append(problem)
        return "; ".join(problems) or None

    async def _write_node(self, node: Obj, verdict: decisions.PoolVerdict) -> bool:
        """False when the node is gone."""
        name = node["metadata"]["name"]
        patch = decisions.node_gate_patch(node, verdict, self.deps.clock())
        try:
            for w in patch.ordered():
                sub = "status" if w.subresource is decisions.NodeSubresource.STATUS else None
                updated = await self.wl.patch(NODES, name, w.body, sub=sub, content_type=w.content_type)
                self.nodes[name] = updated
            if verdict.ready and patch.taint_ops is not None and name in self.slice_seen:
                latency = time.monotonic() - self.slice_seen[name]
                self.latencies.append(latency)
                metrics.GATE_SECONDS.labels(transition="untaint").observe(latency)
        except (Invalid, Conflict):
            fresh = await self.wl.get_or_none(NODES, name)
            if fresh is None:
                return False
            self.nodes[name] = fresh  # someone else wrote the taints; decide again on the next event
        except NotFound:
            return False
        return True

    async def _write_gate_slice(self, node: Obj, verdict: decisions.PoolVerdict, devices: int) -> None:
        name = node["metadata"]["name"]
        slice_name = decisions.gate_slice_name(name)
        current = self.slices.get(slice_name)
        generation = int((current or {}).get("spec", {}).get("pool", {}).get("generation", 0))
        uid = node["metadata"]["uid"]
        held = self._held_devices(name)
        desired = decisions.gate_slice(
            name, max(1, generation), devices=devices, ready=verdict.ready, node_uid=uid, held=held
        )
        if current is not None and _devices(current) == _devices(desired):
            return
        try:
            if current is None:
                self.slices[slice_name] = await self.wl.create(RESOURCESLICES, desired)
            else:
                desired = decisions.gate_slice(
                    name, generation + 1, devices=devices, ready=verdict.ready, node_uid=uid, held=held
                )
                desired["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                self.slices[slice_name] = await self.wl.replace(RESOURCESLICES, desired)
        except Conflict:
            fresh = await self.wl.get_or_none(RESOURCESLICES, slice_name)
            if fresh is not None:
                self.slices[slice_name] = fresh

    def _held_devices(self, node: str) -> frozenset[str]:
        """Gate devices on ``node`` held by claims seen allocated before the node turned not ready."""
        since = self._not_ready_since.get(node)
        if since is None:
            return frozenset()
        return frozenset(
            str(r.get("device", ""))
            for key, claim in self.claims.items()
            if self._allocated_seen.get(key, since) < since
            for r in decisions.gate_results(claim, gated_only=False)
            if r.get("pool") == node
        )

    async def _write_machine(self, capi_machine: str, verdict: decisions.PoolVerdict) -> bool:
        """False when held back because the Machine or its Cluster is paused (a gone Machine is done)."""
        obj = await self.deps.kube.get_or_none(CAPI_MACHINES, capi_machine, self.namespace)
        if obj is None:
            return True
        cluster = await self.deps.kube.get_or_none(CAPI_CLUSTERS, self.cluster, self.namespace)
        if pause.is_paused(cluster, obj):
            self.cluster_paused = self.cluster_paused or pause.is_paused(cluster)
            return False
        previous = next(
            (c for c in (obj.get("status") or {}).get("conditions", []) if c.get("type") == domain.GPU_READY_CONDITION),
            None,
        )
        cond = decisions.machine_condition(
            verdict, self.deps.clock(), int(obj["metadata"].get("generation", 1)), previous
        )
        body = {
            "apiVersion": domain.CAPI_API_VERSION,
            "kind": "Machine",
            "metadata": {"name": capi_machine, "namespace": self.namespace},
            "status": {"conditions": [cond]},
        }
        await self.deps.kube.apply_patch(CAPI_MACHINES, capi_machine, body, MANAGER, self.namespace, sub="status")
        return True

    async def gate_claims(self, keys: set[tuple[str, str]]) -> None:
        # Only the pools of the nodes these claims sit on: every pool scans all slices, and doing it for
        # every node on every claim event grows with nodes x slices.
        nodes = {n for k in keys if (n := _gate_node(self.claims.get(k, {}))) is not None and n in self.verdicts}
        pools = {n: p for n in nodes for p in decisions.current_pools(self.slices.values(), n).values()}
        for key in sorted(keys):
            self._recheck.pop(key, None)
            claim = self.claims.get(key)
            self._waiting.discard(key)
            if claim is None:
                continue
            d = decisions.claim_gate_decision(claim, self.verdicts, pools, self.deps.clock())
            if d.outcome is decisions.GateOutcome.WAIT:
                self._waiting.add(key)
            if d.outcome is decisions.GateOutcome.WAIT and d.recheck_at is not None:
                delay = (d.recheck_at - self.deps.clock()).total_seconds()
                self._recheck[key] = time.monotonic() + max(0.5, delay)
            elif d.outcome in (decisions.GateOutcome.BIND, decisions.GateOutcome.FAIL):
                await self._write_claim(key, claim, d)
        metrics.CLAIMS_WAITING.labels(cluster=f"{self.namespace}/{self.cluster}").set(len(self._waiting))

    async def _write_claim(self, key: tuple[str, str], claim: Obj, d: decisions.ClaimGateDecision) -> None:
        devices = decisions.merged_device_statuses(claim, d.entries)
        body = {"metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]}, "status": {"devices": devices}}
        try:
            self.claims[key] = await self.wl.patch(RESOURCECLAIMS, key[1], body, key[0], sub="status")
            metrics.CLAIM_DECISIONS.labels(outcome=d.outcome.value).inc()
            if (seen := self._allocated_seen.get(key)) is not None:
                latency = time.monotonic() - seen
                self.claim_latencies.append(latency)
                metrics.GATE_SECONDS.labels(transition=f"claim-{d.outcome.value.lower()}").observe(latency)
            log.info("claim %s/%s: %s on %s (%s)", key[0], key[1], d.outcome.value, d.node, d.reason)
        except Conflict:
            self._recheck[key] = time.monotonic() + 0.2  # re-read on the next event or shortly
        except KubeError as exc:
            # No claim event will come to retry on (the scheduler only polls), and an unanswered claim
            # holds its pod until bindingTimeout: try again shortly.
            log.warning("claim %s/%s: status write failed: %s; retrying", key[0], key[1], exc)
            self._recheck[key] = time.monotonic() + 2.0


def _node_of(pod: Obj) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _gate_node(claim: Obj) -> str | None:
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return next((r.get("pool") for r in results if r.get("driver") == domain.GATE_DRIVER), None)


def _devices(slice_: Obj) -> list[Any]:
    """A slice's devices as we write them: the apiserver stamps ``timeAdded`` on every device taint, so
    comparing with it would rewrite (and bump the generation of) a not-ready node's gate slice on every
    Node event, waking kube-scheduler and every other slice watcher each time."""
    devices = []
    for raw in (slice_.get("spec") or {}).get("devices") or []:
        device = dict(raw)
        if device.get("taints"):
            device["taints"] = [{k: v for k, v in t.items() if k != "timeAdded"} for t in device["taints"]]
        devices.append(device)
    return devices
