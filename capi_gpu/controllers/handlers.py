"""kopf registrations: every handler is a translation from kwargs to one service call.

Per-object daemons own the slow loops (host provisioning, machine claims, cluster checks); update
handlers only wake them; delete handlers decide when kopf may drop the finalizer. The finalizer is
moved under the project's domain, kopf's progress annotations under a prefix of their own
(``domain.KOPF_PROGRESS_PREFIX`` says why).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from capi_gpu import domain
from capi_gpu.api.host import HetznerGPUHost
from capi_gpu.autoscaler import scaler_runner
from capi_gpu.autoscaler import sync as annotation_sync
from capi_gpu.controllers import (
    cluster_delete,
    cluster_loop,
    host_loop,
    machine_loop,
    remediation_loop,
    template_loop,
)
from capi_gpu.provisioning import move
from capi_gpu.readiness import gate_runner
from capi_gpu.runtime.deps import Deps
from capi_gpu.runtime.diffbase import MemoryDiffBaseStorage
from capi_gpu.runtime.settings import Settings

G, V = domain.GROUP, domain.VERSION
Factory = Callable[[], Deps]


def _filter(settings: Settings) -> Callable[..., bool]:
    def when(labels: Mapping[str, str], **_: Any) -> bool:
        return settings.watch_filter is None or labels.get(domain.WATCH_FILTER_LABEL) == settings.watch_filter

    return when


def configure(op: kopf.OperatorSettings) -> None:
    op.persistence.finalizer = f"{domain.DOMAIN}/finalizer"
    op.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=domain.KOPF_PROGRESS_PREFIX)
    op.persistence.diffbase_storage = MemoryDiffBaseStorage()  # no bookkeeping writes on paused objects
    op.posting.level = logging.INFO
    op.watching.server_timeout = 300
    # kopf 1.45 renamed batching to queueing (the old name warns on every start); >=1.38 is allowed.
    (getattr(op, "queueing", None) or op.batching).worker_limit = 200


Loop = Callable[[Deps, str, str, Any], Awaitable[None]]
DAEMONS: tuple[tuple[str, str, Loop], ...] = (
    ("hetznergpuhosts", "host", host_loop.run),
    ("hetznergpumachines", "machine", machine_loop.run),
    ("hetznergpuclusters", "cluster", cluster_loop.run),
    ("hetznergpumachinetemplates", "template", template_loop.run),
    ("hetznergpuremediations", "remediation", remediation_loop.run),
)


def _daemon(registry: kopf.OperatorRegistry, when: Callable[..., bool], plural: str, kind: str, loop: Loop) -> None:
    async def daemon(namespace: str | None, name: str, stopped: kopf.DaemonStopped, memo: Any, **_: Any) -> None:
        await loop(memo.deps, namespace or "", name, stopped)

    kopf.daemon(G, V, plural, id=f"{kind}-loop", registry=registry, when=when, cancellation_timeout=10)(daemon)

    async def woken(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
        memo.deps.wakeups.wake(kind, namespace or "", name)

    kopf.on.update(G, V, plural, id=f"{kind}-spec", registry=registry, when=when, field="spec")(woken)


def register(registry: kopf.OperatorRegistry, settings: Settings, make_deps: Factory) -> None:
    when = _filter(settings)

    @kopf.on.startup(id="startup", registry=registry)
    async def startup(memo: Any, **kwargs: Any) -> None:
        configure(kwargs["settings"])  # kopf's OperatorSettings; ``settings`` here is ours
        # asyncio.to_thread (every SSH step, blocking for seconds) shares the default executor: size it for
        # every host provisioning at once, not for the CPU count (min(32, CPUs + 4) is 6 on 2 CPUs).
        io_threads = 2 * settings.provisioning_limit + 8
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="io")
        )
        memo.deps = make_deps()

    @kopf.on.cleanup(id="cleanup", registry=registry)
    async def cleanup(memo: Any, **_: Any) -> None:
        await memo.deps.robots.close()
        memo.deps.kube.close()

    for plural, kind, loop in DAEMONS:
        _daemon(registry, when, plural, kind, loop)
    _host_levers(registry, when)
    _deletions(registry, when)
    if settings.gate:
        _gate(registry, when)
    _autoscaler(registry, settings, when)
    _ = (startup, cleanup)


# The operator's levers on a host that are annotations, not spec: removing permanent-error, asking for a
# reinspection. A change wakes the host's loop at once instead of at its next poll.
HOST_LEVERS = {
    "host-permanent-error": domain.ANNOTATION_PERMANENT_ERROR,
    "host-reinspect": domain.ANNOTATION_REINSPECT,
}


def _host_levers(registry: kopf.OperatorRegistry, when: Callable[..., bool]) -> None:
    async def woken(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
        memo.deps.wakeups.wake("host", namespace or "", name)

    for handler_id, key in HOST_LEVERS.items():
        field = ("metadata", "annotations", key)
        kopf.on.update(G, V, "hetznergpuhosts", id=handler_id, registry=registry, when=when, field=field)(woken)


def _deletions(registry: kopf.OperatorRegistry, when: Callable[..., bool]) -> None:
    @kopf.on.delete(G, V, "hetznergpuhosts", id="host-delete", registry=registry, when=when)
    async def host_delete(body: kopf.Body, **_: Any) -> None:
        host = HetznerGPUHost.model_validate(dict(body))
        moving = domain.DELETE_FOR_MOVE_ANNOTATION in (body["metadata"].get("annotations") or {})
        consumer = host.spec.consumer_ref.name if host.spec.consumer_ref is not None else None
        raw = dict(body)
        raw_status = dict(raw["status"]) if isinstance(raw.get("status"), Mapping) else raw.get("status")
        snapshot = (body["metadata"].get("annotations") or {}).get(domain.ANNOTATION_STATUS)
        status = move.deleted_status(host.status, raw_status, snapshot)  # a moved host's record: in its snapshot
        if (why := move.deletion_refused(status, consumer, moving)) is not None:
            raise kopf.TemporaryError(why, delay=30)

    @kopf.on.delete(G, V, "hetznergpumachines", id="machine-delete", registry=registry, when=when)
    async def machine_delete(body: kopf.Body, namespace: str | None, name: str, memo: Any, **_: Any) -> None:
        if not await machine_loop.release(memo.deps, namespace or "", name, dict(body)):
            raise kopf.TemporaryError("waiting for the host to deprovision", delay=5)

    @kopf.on.event("cluster.x-k8s.io", "v1beta2", "machines", id="capi-machine", registry=registry, when=when)
    async def capi_machine(spec: kopf.Spec, namespace: str | None, memo: Any, **_: Any) -> None:
        ref = spec.get("infrastructureRef") or {}
        if ref.get("apiGroup") == G and ref.get("kind") == "HetznerGPUMachine":
            memo.deps.wakeups.wake("machine", namespace or "", ref["name"])  # e.g. bootstrap data arrived

    @kopf.on.event(G, V, "hetznergpumachines", id="machine-owner", registry=registry, when=when)
    async def machine_owner(body: kopf.Body, namespace: str | None, name: str, memo: Any, **_: Any) -> None:
        if machine_loop.owner_arrived(dict(body)):  # CAPI set ownerReferences: metadata, no spec update
            memo.deps.wakeups.wake("machine", namespace or "", name)

    @kopf.on.delete(G, V, "hetznergpuclusters", id="cluster-delete", registry=registry, when=when)
    async def cluster_delete_(body: kopf.Body, memo: Any, **_: Any) -> None:
        if not await cluster_delete.delete(memo.deps, dict(body)):
            raise kopf.TemporaryError("waiting for the hcloud Load Balancer to be deleted", delay=15)

    _ = (host_delete, machine_delete, capi_machine, machine_owner, cluster_delete_)


def _gate(registry: kopf.OperatorRegistry, when: Callable[..., bool]) -> None:
    @kopf.daemon(G, V, "hetznergpuclusters", id="gate", registry=registry, when=when, cancellation_timeout=10)
    async def gate_daemon(
        body: kopf.Body, namespace: str | None, stopped: kopf.DaemonStopped, memo: Any, **_: Any
    ) -> None:
        await gate_runner.run_for(memo.deps, namespace or "", body["metadata"]["name"], stopped)

    _ = gate_daemon


def _autoscaler(registry: kopf.OperatorRegistry, settings: Settings, when: Callable[..., bool]) -> None:
    """The optional autoscaling loops (docs/autoscaling.md): the claim-aware scaler, one per cluster, and
    the CA annotation sync, one per template, woken by MachineDeployment events (an event handler puts
    no kopf finalizer on CAPI's objects; a daemon on them would)."""
    if settings.claim_scaler:

        @kopf.daemon(
            G, V, "hetznergpuclusters", id="claim-scaler", registry=registry, when=when, cancellation_timeout=10
        )
        async def claim_scaler(
            body: kopf.Body, namespace: str | None, stopped: kopf.DaemonStopped, memo: Any, **_: Any
        ) -> None:
            await scaler_runner.run_for(memo.deps, namespace or "", body["metadata"]["name"], stopped)

        _ = claim_scaler
    if settings.template_sync_annotations:

        @kopf.daemon(
            G,
            V,
            "hetznergpumachinetemplates",
            id="ca-annotations",
            registry=registry,
            when=when,
            cancellation_timeout=10,
        )
        async def ca_annotations(
            namespace: str | None, name: str, stopped: kopf.DaemonStopped, memo: Any, **_: Any
        ) -> None:
            await annotation_sync.run(memo.deps, namespace or "", name, stopped)

        @kopf.on.event("cluster.x-k8s.io", "v1beta2", "machinedeployments", id="md-event", registry=registry, when=when)
        async def machinedeployment(spec: kopf.Spec, namespace: str | None, memo: Any, **_: Any) -> None:
            template = annotation_sync.template_of(spec)
            if template is not None:
                memo.deps.wakeups.wake(annotation_sync.KIND, namespace or "", template)

        _ = (ca_annotations, machinedeployment)
