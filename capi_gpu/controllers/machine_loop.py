"""The HetznerGPUMachine reconcile (v1beta2 InfraMachine contract), as a loop per machine.

Order, as the contract's typical workflow: wait for the Machine owner, the Cluster's infrastructure and
the bootstrap data; validate the bootstrap data and the GPU layout (bad input stops here, before any
host is claimed or touched); claim a host exclusively (consumerRef, written with a resourceVersion
precondition); mirror the host's progress; once the node joined, set providerID, addresses,
failureDomain and ``initialization.provisioned``. Conditions are derived at the end of each pass.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.base import AddressType, MachineAddress, ObjectReference
from capi_gpu.api.host import HetznerGPUHost, HostState
from capi_gpu.api.machine import HetznerGPUMachine, HetznerGPUMachineStatus
from capi_gpu.api.specs import MigMode, prepared_key
from capi_gpu.controllers import host_pick
from capi_gpu.controllers.host_context import HOSTS, MACHINES
from capi_gpu.gpu import gpuplan
from capi_gpu.kube import CAPI_CLUSTERS, CAPI_MACHINES, SECRETS, Conflict, Obj
from capi_gpu.provisioning import bootstrap
from capi_gpu.runtime import events, loops, pause
from capi_gpu.runtime.deps import Deps

log = logging.getLogger(__name__)
# HostAssociated=False reason: free hosts exist, none in Machine.spec.failureDomain (it waits for one).
NO_HOST_IN_FAILURE_DOMAIN = "NoHostInFailureDomain"


@dataclass
class Scope:
    obj: Obj
    machine: HetznerGPUMachine
    namespace: str
    name: str
    capi_machine: Obj | None = None
    cluster: Obj | None = None
    host: HetznerGPUHost | None = None
    conds: dict[str, tuple[bool, str, str]] = field(default_factory=dict)
    notes: list[tuple[str, str, bool]] = field(default_factory=list)
    requeue: float = 30.0

    def cond(self, type_: c.Type, ok: bool, reason: str, message: str) -> None:
        self.conds[type_.value] = (ok, reason, message)

    def wait(self, type_: c.Type, reason: str, message: str, requeue: float = 30.0) -> None:
        self.cond(type_, False, reason, message)
        self.requeue = requeue


def _owner(obj: Obj, kind: str) -> dict[str, Any] | None:
    return next((o for o in obj["metadata"].get("ownerReferences", []) if o.get("kind") == kind), None)


def paused(scope: Scope) -> bool:
    return pause.is_paused(scope.cluster, scope.obj)


def _woken_wait(deps: Deps) -> float:
    """The requeue of a wait that a wake-up ends (the owner appears: ``owner_arrived`` on this object's
    own event; bootstrap data: the CAPI Machine's event), a safety net only: as long as an idle host's
    (300 s), so a thousand waiting machines cost a tenth of what a 30 s poll did (bench/scale.py)."""
    return deps.settings.timing.poll * 30


def owner_arrived(obj: Obj) -> bool:
    """An owning Machine is set, and the last pass still said it waits for one: wake the loop."""
    conditions: list[dict[str, Any]] = (obj.get("status") or {}).get("conditions") or []
    ready = next((x for x in conditions if x.get("type") == "Ready"), {})
    return _owner(obj, "Machine") is not None and ready.get("reason") == c.Reason.WAITING_FOR_MACHINE_OWNER


async def _load(deps: Deps, s: Scope) -> bool:
    owner = _owner(s.obj, "Machine")
    if owner is None:
        s.wait(c.Type.READY, c.Reason.WAITING_FOR_MACHINE_OWNER, "no owning CAPI Machine yet", _woken_wait(deps))
        return False
    s.capi_machine = await deps.kube.get_or_none(CAPI_MACHINES, owner["name"], s.namespace)
    cluster_name = (s.obj["metadata"].get("labels") or {}).get(domain.CLUSTER_NAME_LABEL)
    if cluster_name:
        s.cluster = await deps.kube.get_or_none(CAPI_CLUSTERS, cluster_name, s.namespace)
    return s.capi_machine is not None and s.cluster is not None


async def _bootstrap_ok(deps: Deps, s: Scope) -> bool:
    init = (s.cluster or {}).get("status", {}).get("initialization", {})
    if not init.get("infrastructureProvisioned"):
        s.wait(c.Type.READY, c.Reason.WAITING_FOR_INFRASTRUCTURE, "Cluster infrastructure is not provisioned yet")
        return False
    secret_name = ((s.capi_machine or {}).get("spec", {}).get("bootstrap") or {}).get("dataSecretName")
    if not secret_name:
        s.wait(
            c.Type.BOOTSTRAP_DATA_READY,
            c.Reason.WAITING_FOR_BOOTSTRAP_DATA,
            "Machine has no bootstrap data yet",
            _woken_wait(deps),
        )
        return False
    secret = await deps.kube.get_or_none(SECRETS, secret_name, s.namespace)
    try:
        bootstrap.decode_secret((secret or {}).get("data"))
    except bootstrap.BootstrapError as exc:
        s.wait(c.Type.BOOTSTRAP_DATA_READY, exc.problem.value, f"Secret {secret_name}: {exc}", 60.0)
        s.notes.append((exc.problem.value, f"Secret {secret_name}: {exc}; no host is claimed", True))
        return False
    s.cond(c.Type.BOOTSTRAP_DATA_READY, True, c.Reason.READY, f"Secret {secret_name}")
    return True


def _layout_ok(s: Scope) -> bool:
    gpu = s.machine.spec.gpu
    if gpu is None:
        s.cond(c.Type.LAYOUT_VALID, True, c.Reason.READY, "no GPU stack requested")
        return True
    try:
        plan = gpuplan.plan(gpu, gpuplan.DEFAULT_MODEL)
    except gpuplan.PlanError as exc:
        s.wait(c.Type.LAYOUT_VALID, exc.reason.value, str(exc), 300.0)
        s.notes.append((exc.reason.value, f"{exc}; no host is claimed", True))
        return False
    if gpu.mig_mode is MigMode.DYNAMIC:
        # Refused before a host is claimed: the shipped chart values run the driver with DynamicMIG off, and the
        # gate has no layout to check such a node against, so its startup taint would never be lifted.
        reason = c.Reason.DYNAMIC_MIG_UNSUPPORTED
        msg = (
            "migMode Dynamic is not supported: the NVIDIA DRA driver is installed with DynamicMIG off "
            "(config/dra-driver/values.yaml) and the readiness gate cannot verify a node without a layout, "
            "so its startup taint would never be lifted; use migMode Static with a layout"
        )
        s.wait(c.Type.LAYOUT_VALID, reason.value, msg, 300.0)
        s.notes.append((reason.value, f"{msg}; no host is claimed", True))
        return False
    s.machine.status.layout = plan.key
    s.cond(c.Type.LAYOUT_VALID, True, c.Reason.READY, f"layout {plan.key} fits {plan.model.key}")
    return True


async def _claim(deps: Deps, s: Scope) -> bool:
    hosts = [HetznerGPUHost.model_validate(h) for h in await deps.kube.list(HOSTS, s.namespace)]
    spec = s.machine.spec
    version = spec.kubernetes_version or (s.capi_machine or {}).get("spec", {}).get("version") or "v1.36.3"
    gpu_model = spec.gpu.model or gpuplan.DEFAULT_MODEL if spec.gpu is not None else None
    failure_domain = (s.capi_machine or {}).get("spec", {}).get("failureDomain") or None
    prepared = prepared_key(spec.install_image, spec.gpu, version)
    pick = host_pick.choose(hosts, spec.host_selector, gpu_model, prepared, failure_domain)
    if pick.host is None:
        reason: str = c.Reason.NO_MATCHING_HOST
        where = ""
        if pick.failure_domain_only:
            reason, where = NO_HOST_IN_FAILURE_DOMAIN, f" in failure domain {failure_domain}"
        s.wait(c.Type.HOST_ASSOCIATED, reason, f"no host to claim{where}: {pick.describe()}", 60.0)
        return False
    host = pick.host
    ref = ObjectReference(
        api_version=domain.API_VERSION,
        kind="HetznerGPUMachine",
        name=s.name,
        namespace=s.namespace,
        uid=s.obj["metadata"]["uid"],
    )
    try:  # the resourceVersion precondition makes the claim exclusive
        await deps.kube.patch(
            HOSTS,
            str(host.metadata["name"]),
            {
                "metadata": {"resourceVersion": host.metadata["resourceVersion"], "labels": _consumer_labels(s.obj)},
                "spec": {"consumerRef": ref.wire()},
            },
            s.namespace,
        )
    except Conflict:
        s.wait(c.Type.HOST_ASSOCIATED, c.Reason.NO_MATCHING_HOST, "lost a race for a host; retrying", 1.0)
        return False
    await deps.kube.patch(
        MACHINES, s.name, {"metadata": {"annotations": {domain.ANNOTATION_HOST: host.metadata["name"]}}}, s.namespace
    )
    deps.wakeups.wake("host", s.namespace, str(host.metadata["name"]))
    s.notes.append(
        (
            "HostClaimed",
            f"claimed {host.metadata['name']} (server {host.spec.server_number}, {host.status.state.value})",
            False,
        )
    )
    s.host = host
    return True


def _consumer_labels(machine: Obj) -> dict[str, str | None]:
    cluster = (machine["metadata"].get("labels") or {}).get(domain.CLUSTER_NAME_LABEL)
    return {domain.CONSUMER_CLUSTER_LABEL: cluster or None}


async def _associated_host(deps: Deps, s: Scope) -> HetznerGPUHost | None:
    name = (s.obj["metadata"].get("annotations") or {}).get(domain.ANNOTATION_HOST) or s.machine.status.host
    if not name:
        return None
    obj = await deps.kube.get_or_none(HOSTS, name, s.namespace)
    if obj is None:
        return None
    host = HetznerGPUHost.model_validate(obj)
    ref = host.spec.consumer_ref
    return host if ref is not None and ref.name == s.name else None


def _mirror(s: Scope, host: HetznerGPUHost) -> None:
    st = host.status
    s.machine.status.host = str(host.metadata["name"])
    s.cond(
        c.Type.HOST_ASSOCIATED,
        True,
        c.Reason.HOST_CLAIMED,
        f"{host.metadata['name']} (server {host.spec.server_number})",
    )
    if st.state is HostState.PROVISIONED:
        s.machine.spec.provider_id = f"{domain.PROVIDER_ID_PREFIX}{host.spec.server_number}"
        s.machine.status.initialization.provisioned = True
        addrs = [MachineAddress(type=AddressType.HOSTNAME, address=str(host.metadata["name"]))]
        addrs += [MachineAddress(type=AddressType.EXTERNAL_IP, address=ip) for ip in (st.ipv4, st.ipv6) if ip]
        s.machine.status.addresses = addrs
        s.machine.status.failure_domain = (st.datacenter or "").lower() or None
        s.cond(c.Type.HOST_READY, True, c.Reason.PROVISIONED, "node joined")
        s.requeue = 300.0
    elif st.state is HostState.ERROR:
        s.wait(c.Type.HOST_READY, c.Reason.HOST_ERROR, f"{st.error_type}: {st.error_message}", 30.0)
    else:
        step = f"/{st.step.value}" if st.step else ""
        s.wait(c.Type.HOST_READY, c.Reason.PROVISIONING, f"host {st.state.value}{step}", 10.0)


async def reconcile(deps: Deps, namespace: str, name: str) -> float | None:
    obj = await deps.kube.get_or_none(MACHINES, name, namespace)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    s = Scope(obj, HetznerGPUMachine.model_validate(obj), namespace, name)
    before = s.machine.model_dump()
    if await _load(deps, s) and not paused(s):
        host = await _associated_host(deps, s)
        if host is None and await _bootstrap_ok(deps, s) and _layout_ok(s) and await _claim(deps, s):
            host = s.host
        if host is not None:
            _mirror(s, host)
            await _remediate_if_broken(deps, s, host)
    elif s.cluster is not None and paused(s):
        s.cond(c.Type.PAUSED, True, c.Reason.PAUSED, "Cluster or machine is paused")
    await _finish(deps, s, before)
    return s.requeue


async def _remediate_if_broken(deps: Deps, s: Scope, host: HetznerGPUHost) -> None:
    """A permanent host error or maintenance: ask CAPI to replace the Machine (CAPH's pattern)."""
    broken = (host.status.state is HostState.ERROR and host.status.error_permanent) or host.spec.maintenance_mode
    if broken and s.capi_machine is not None:
        ann = s.capi_machine["metadata"].get("annotations") or {}
        if domain.REMEDIATE_MACHINE_ANNOTATION not in ann:
            await deps.kube.patch(
                CAPI_MACHINES,
                s.capi_machine["metadata"]["name"],
                {"metadata": {"annotations": {domain.REMEDIATE_MACHINE_ANNOTATION: ""}}},
                s.namespace,
            )
            s.notes.append(
                (
                    "RemediationRequested",
                    f"host {host.metadata['name']} cannot serve: {host.status.error_message or 'maintenance'}",
                    True,
                )
            )


def _ready(s: Scope) -> tuple[bool, str, str]:
    if "Paused" in s.conds and s.conds["Paused"][0]:
        # Paused writes nothing but the Paused condition (CAPI's contract): Ready stays as it was, so a
        # clusterctl move's source does not turn its machines not-ready (the real move found this write).
        current = next((x for x in s.machine.status.conditions if x.type == c.Type.READY.value), None)
        if current is not None:
            return current.status == "True", current.reason, current.message or ""
        return False, c.Reason.PAUSED, "paused"
    for t in (c.Type.BOOTSTRAP_DATA_READY, c.Type.LAYOUT_VALID, c.Type.HOST_ASSOCIATED, c.Type.HOST_READY):
        if t.value in s.conds and not s.conds[t.value][0]:
            return False, s.conds[t.value][1], s.conds[t.value][2]
    if "Ready" in s.conds:
        return s.conds["Ready"]
    return (
        (True, c.Reason.READY, "provisioned")
        if s.machine.status.initialization.provisioned
        else (False, c.Reason.PROVISIONING, "provisioning")
    )


async def _finish(deps: Deps, s: Scope, before: dict[str, Any]) -> None:
    now = deps.clock()
    gen = s.obj["metadata"].get("generation")
    conds = s.machine.status.conditions
    s.conds.setdefault("Paused", (False, c.Reason.NOT_PAUSED, ""))
    s.conds["Ready"] = _ready(s)
    for t, (ok, reason, msg) in s.conds.items():
        conds = c.set_condition(conds, t, ok, reason, msg, now, gen)
    s.machine.status.conditions = conds
    if s.machine.spec.provider_id and s.obj.get("spec", {}).get("providerID") != s.machine.spec.provider_id:
        await deps.kube.patch(MACHINES, s.name, {"spec": {"providerID": s.machine.spec.provider_id}}, s.namespace)
        cluster = (s.obj["metadata"].get("labels") or {}).get(domain.CLUSTER_NAME_LABEL)
        if cluster:
            deps.wakeups.wake("gate", s.namespace, cluster)  # its node is now one the gate owns
    if s.machine.status.model_dump() != HetznerGPUMachineStatus.model_validate(before["status"]).model_dump():
        await deps.kube.patch(
            MACHINES,
            s.name,
            {"status": s.machine.status.model_dump(by_alias=True, mode="json")},
            s.namespace,
            sub="status",
        )
    for reason, msg, warn in s.notes:
        events.emit(s.obj, reason, msg, warn)


async def release(deps: Deps, namespace: str, name: str, obj: Obj) -> bool:
    """Deletion: give the host back and wait until it left the provisioned states. True when done."""
    if domain.DELETE_FOR_MOVE_ANNOTATION in (obj["metadata"].get("annotations") or {}):
        return True  # clusterctl move: the server keeps running, untouched
    host_name = (obj["metadata"].get("annotations") or {}).get(domain.ANNOTATION_HOST) or (obj.get("status") or {}).get(
        "host"
    )
    if not host_name:
        return True
    host_obj = await deps.kube.get_or_none(HOSTS, host_name, namespace)
    if host_obj is None:
        return True
    host = HetznerGPUHost.model_validate(host_obj)
    ref = host.spec.consumer_ref
    if ref is not None and ref.name == name:
        await deps.kube.patch(
            HOSTS,
            host_name,
            {"metadata": {"labels": {domain.CONSUMER_CLUSTER_LABEL: None}}, "spec": {"consumerRef": None}},
            namespace,
        )
        deps.wakeups.wake("host", namespace, host_name)
        events.emit(obj, "HostReleased", f"released {host_name}; deprovisioning")
        return False
    busy = {HostState.PROVISIONED, HostState.PROVISIONING, HostState.DEPROVISIONING}
    return host.status.state not in busy or host.spec.consumer_ref is not None


async def run(deps: Deps, namespace: str, name: str, stopped: Any) -> None:
    await loops.run("machine", reconcile, deps, namespace, name, stopped)
