"""The claim-aware scaler for one workload cluster: watches pods, ResourceClaims and ResourceSlices there
and raises ``spec.replicas`` of the MachineDeployments it owns in the management cluster.

cluster-autoscaler cannot scale a MIG MachineDeployment from zero (its synthetic slice has no ``profile``,
kubernetes/autoscaler#10199); this covers exactly that, and never competes with CA: it only raises
MachineDeployments whose owner annotation says ``claim-scaler`` (CA is told to skip those through its
discovery labels, see docs/autoscaling.md), and it only ever raises. Each pass reads the state afresh
(nothing is remembered between passes but which messages were already said), so a restart, a human edit
or a CA scale-up is simply seen next time.

Next to CA in the same cluster (``pods=PodPolicy.CA_DECLINED``, ``--claim-scaler-pods ca-declined``) it
also watches CA's Events on pods and takes only the pods CA declined (``ca_verdicts``): the two scalers
then never add nodes for the same claim, however close together they decide.

Passes are event-driven with a debounce: a burst of pod and claim changes (a Job of 20 pods) becomes one
pass once the cluster has been quiet for ``debounce`` seconds; a resync every ``resync`` seconds covers
the pending grace and management-side changes (replicas, Machines getting nodes). The replicas patch
carries the resourceVersion it was decided on, so a concurrent change makes it fail and the next pass
decides again. It is never sent to a paused MachineDeployment or Cluster (``runtime.pause``, asked right
before the write): a paused Cluster ends the scaler until its supervisor sees the resume, so the source of
a clusterctl move is not written in the up to 30 s the supervisor takes to notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from capi_gpu import domain
from capi_gpu.autoscaler import ca_verdicts, decide, demand, nodegroup, supply
from capi_gpu.kube import (
    CAPI_CLUSTERS,
    CAPI_MACHINEDEPLOYMENTS,
    CAPI_MACHINES,
    DEVICECLASSES,
    EVENTS,
    PODS,
    RESOURCECLAIMS,
    RESOURCECLAIMTEMPLATES,
    RESOURCESLICES,
    AsyncKube,
    Conflict,
    KubeError,
    Obj,
    ours,
)
from capi_gpu.readiness.informer import Change, Feed
from capi_gpu.runtime import events, pause
from capi_gpu.runtime.deps import Deps
from capi_gpu.runtime.settings import PodPolicy

log = logging.getLogger(__name__)
TEMPLATES = ours("hetznergpumachinetemplates")
Emit = Callable[..., None]


class ClaimScaler:
    def __init__(
        self,
        deps: Deps,
        namespace: str,
        cluster: str,
        workload: AsyncKube,
        *,
        debounce: float = 2.0,
        resync: float = 30.0,
        grace: datetime.timedelta = demand.DEFAULT_GRACE,
        emit: Emit = events.emit,
        pods: PodPolicy = PodPolicy.ALL,
        ca_grace: datetime.timedelta = datetime.timedelta(0),
    ) -> None:
        self.deps, self.namespace, self.cluster, self.wl = deps, namespace, cluster, workload
        self.debounce, self.resync, self.grace, self.emit = debounce, resync, grace, emit
        self.policy, self.ca_grace = pods, ca_grace
        self.pods: dict[demand.Key, Obj] = {}
        self.claims: dict[demand.Key, Obj] = {}
        self.slices: dict[str, Obj] = {}
        self.ca_events: dict[demand.Key, Obj] = {}  # CA's Events on pods (PodPolicy.CA_DECLINED only)
        self._synced: set[str] = set()
        self._listing: dict[str, set[Any]] = {}
        self._said: dict[str, str] = {}  # what was last logged or posted, per subject: say things once
        self.last: decide.Decision | None = None
        self.cluster_paused = False
        """A pass found the Cluster paused before raising: ``run`` returns."""

    async def run(self, stopped: Any) -> None:
        feed = Feed(self.wl.sync)
        for res, kind in ((PODS, "pod"), (RESOURCECLAIMS, "claim"), (RESOURCESLICES, "slice")):
            feed.watch(res, kind)
        if self.policy is PodPolicy.CA_DECLINED:
            # CA's verdict comes after the pod turned Unschedulable: its Event must wake a pass too.
            feed.watch(EVENTS, "event", field_selector=ca_verdicts.FIELD_SELECTOR)
        try:
            while not stopped:
                with contextlib.suppress(TimeoutError):
                    self._apply(await asyncio.wait_for(feed.queue.get(), timeout=self.resync))
                    await self._quiet(feed.queue)
                if len(self._synced) == len(feed.informers):
                    try:
                        await self.evaluate()
                    except (KubeError, OSError) as exc:  # an apiserver blip: the next change or resync retries
                        log.warning("claim scaler %s/%s: pass failed: %s", self.namespace, self.cluster, exc)
                    if self.cluster_paused:
                        log.info("claim scaler %s/%s: Cluster paused; stopping", self.namespace, self.cluster)
                        return
        finally:
            feed.stop()

    async def _quiet(self, queue: asyncio.Queue[Change]) -> None:
        """Take changes until none came for ``debounce`` seconds (at most four debounces in all)."""
        deadline = time.monotonic() + 4 * self.debounce
        while (left := deadline - time.monotonic()) > 0:
            try:
                self._apply(await asyncio.wait_for(queue.get(), timeout=min(self.debounce, left)))
            except TimeoutError:
                return

    def _apply(self, ch: Change) -> None:
        stores: dict[str, dict[Any, Obj]] = {
            "pod": self.pods,
            "claim": self.claims,
            "slice": self.slices,
            "event": self.ca_events,
        }
        store = stores[ch.kind]
        listed = self._listing.setdefault(ch.kind, set())
        if ch.type == "SYNCED":  # a (re)list ended: what it did not return is gone
            for gone in set(store) - listed:
                del store[gone]
            listed.clear()
            self._synced.add(ch.kind)
            return
        meta = ch.obj.get("metadata", {})
        key: Any = str(meta.get("name", ""))
        if ch.kind != "slice":
            key = (str(meta.get("namespace", "")), key)
        if ch.type == "SYNC":
            listed.add(key)
        if ch.type == "DELETED":
            store.pop(key, None)
        else:
            store[key] = ch.obj

    async def evaluate(self) -> decide.Decision | None:
        """One pass: read, decide, raise. None when nothing is pending or no MachineDeployment is ours."""
        now = self.deps.clock()
        if not any(demand.unschedulable(p, now, self.grace) for p in self.pods.values()):
            return None
        mds = {
            str(md["metadata"]["name"]): md
            for md in await self.deps.kube.list(CAPI_MACHINEDEPLOYMENTS, self.namespace)
            if (md.get("spec") or {}).get("clusterName") == self.cluster and nodegroup.bounds(md) is not None
        }
        if not any(nodegroup.owner(md) is nodegroup.ScaleOwner.CLAIM_SCALER for md in mds.values()):
            return None
        groups = await self._groups(mds)
        classes = {str(c["metadata"]["name"]): c for c in await self.wl.list(DEVICECLASSES)}
        templates = demand.index(await self.wl.list(RESOURCECLAIMTEMPLATES))
        said = None
        if self.policy is PodPolicy.CA_DECLINED:
            said = ca_verdicts.verdicts(self.ca_events.values())
        want = demand.pending_demand(
            self.pods.values(), self.claims, templates, classes, now, self.grace, said, self.ca_grace
        )
        for ignored in want.ignored:
            self._say(f"pod/{ignored.pod}", f"pod {ignored.pod} ignored: {ignored.reason}")
        for left in want.left_to_ca:
            self._say(
                f"pod/{left.pod}", f"claim scaler {self.namespace}/{self.cluster}: pod {left.pod} left: {left.reason}"
            )
        if not want.requests:
            return None
        free = supply.free_devices(self.slices.values(), self.claims.values())
        decision = decide.decide(want.requests, free, groups)
        log.debug(
            "claim scaler %s/%s: pending %s; free %s; groups %s; %s",
            self.namespace,
            self.cluster,
            want.summary(),
            free,
            [(g.name, g.replicas, g.coming, g.headroom) for g in groups],
            decision,
        )
        self.last = decision
        if await self.raise_all(decision.scale_ups, mds):
            self._report(decision, groups, mds)
        return decision

    async def raise_all(self, ups: tuple[decide.ScaleUp, ...], mds: Mapping[str, Obj]) -> bool:
        """Send every raise; False when one was not sent, which voids the decision (the next pass decides,
        raises and reports again). A paused Cluster gets none, and ends the scaler (``run`` returns)."""
        if not ups:
            return True
        cluster = await self.deps.kube.get_or_none(CAPI_CLUSTERS, self.cluster, self.namespace)
        if pause.is_paused(cluster):
            self.cluster_paused = True
            return False
        return all([await self._raise(mds[up.group], up, cluster) for up in ups])

    async def _groups(self, mds: Mapping[str, Obj]) -> list[decide.Group]:
        machines = await self.deps.kube.list(
            CAPI_MACHINES, self.namespace, label_selector=f"{domain.CLUSTER_NAME_LABEL}={self.cluster}"
        )
        gpu_nodes = supply.gpu_nodes(self.slices.values())
        out = []
        for name, md in sorted(mds.items()):
            try:
                tpl_name = nodegroup.template_name(md)
                tpl = await self.deps.kube.get_or_none(TEMPLATES, tpl_name, self.namespace)
                if tpl is None:
                    raise nodegroup.NotAGroup(f"{nodegroup.TEMPLATE_KIND} {tpl_name} not found")
                out.append(nodegroup.group(md, nodegroup.node_shape(tpl), machines, gpu_nodes))
            except nodegroup.NotAGroup as exc:
                self._say(f"md/{name}", f"MachineDeployment {self.namespace}/{name} left out: {exc}")
        return out

    async def _raise(self, md: Obj, up: decide.ScaleUp, cluster: Obj | None = None) -> bool:
        """Raise ``up.group`` to ``up.target``; False when the MachineDeployment changed since it was read or
        is paused (``cluster``: its Cluster, read for this pass)."""
        meta = md["metadata"]
        if up.target <= nodegroup.replicas(md):
            return True  # never lower (decide never asks; this is the guard where it is written)
        if pause.is_paused(cluster, md):
            self._say(f"paused/{up.group}", f"MachineDeployment {self.namespace}/{up.group} is paused: not raised")
            return False
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "spec": {"replicas": up.target}}
        try:
            await self.deps.kube.patch(CAPI_MACHINEDEPLOYMENTS, up.group, patch, self.namespace)
        except Conflict:
            log.info(
                "claim scaler %s/%s: %s changed under the decision; deciding again",
                self.namespace,
                self.cluster,
                up.group,
            )
            return False
        log.info("claim scaler %s/%s: %s %s", self.namespace, self.cluster, up.group, up.message())
        self.emit(md, "ClaimScaleUp", up.message())
        self._said.pop(f"blocked/{up.group}", None)
        return True

    def _report(self, decision: decide.Decision, groups: list[decide.Group], mds: Mapping[str, Obj]) -> None:
        """Unserved demand once per change: a Warning on each owned group that offers it but is at max,
        a log line for the rest."""
        for g in groups:
            offered = {p for p, _ in g.devices}
            mine = [
                u for u in decision.unserved if u.why is decide.Shortfall.AT_MAX_SIZE and offered & set(u.alternatives)
            ]
            if not (g.owned and mine):
                self._said.pop(f"blocked/{g.name}", None)  # said again if it comes back
                continue
            message = f"at max size {g.max_size}; still pending: " + "; ".join(u.message() for u in mine)
            if self._said.get(f"blocked/{g.name}") != message:
                self._said[f"blocked/{g.name}"] = message
                self.emit(mds[g.name], "ClaimScaleBlocked", message, warning=True)
        others = [u.message() for u in decision.unserved if u.why is not decide.Shortfall.AT_MAX_SIZE]
        if others:
            self._say("unserved", f"claim scaler {self.namespace}/{self.cluster}: not served: " + "; ".join(others))

    def _say(self, subject: str, message: str) -> None:
        if self._said.get(subject) != message:
            self._said[subject] = message
            log.info("%s", message)
