"""The HetznerGPUCluster reconcile (v1beta2 InfraCluster contract).

Checks the Robot credentials with one cached list call (shared with every host of the account), closes
an open 401 circuit when the Secret changes (``RobotClients`` does that on a new fingerprint), keeps the
optional hcloud Load Balancer for the control-plane endpoint, publishes failure domains, sets
``initialization.provisioned``, and installs the workload cluster's DRA add-ons (``cluster_addons``). A
rejected login is reported as a condition and stops every Robot call of the account until the Secret
changes: three failed logins would block the operator's IP.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.base import Condition
from capi_gpu.api.cluster import APIEndpoint, FailureDomain, HetznerGPUCluster, HetznerGPUClusterStatus
from capi_gpu.controllers import cluster_addons, cluster_vswitch
from capi_gpu.hetzner import cloud
from capi_gpu.hetzner import errors as robot_errors
from capi_gpu.kube import CAPI_CLUSTERS, CAPI_MACHINES, SECRETS, Obj, ours
from capi_gpu.runtime import events, loops, pause
from capi_gpu.runtime.deps import AccessError, Deps, secret_value, secret_version

log = logging.getLogger(__name__)
OWNER_WAIT_S = 2.0  # until CAPI's Cluster controller adopts the HetznerGPUCluster
CLUSTERS = ours("hetznergpuclusters")
HOSTS = ours("hetznergpuhosts")


async def _credentials(deps: Deps, hgc: HetznerGPUCluster, ns: str) -> tuple[bool, str, str, str | None]:
    ref = hgc.spec.robot_credentials
    try:
        robot = await deps.robots.get(deps.kube, ns, ref.name)
    except AccessError as exc:
        return False, exc.reason, str(exc), None
    secret = await deps.kube.get(SECRETS, ref.name, ns)
    digest = secret_version(secret)
    if robot.account.circuit_open:
        return (
            False,
            c.Reason.CREDENTIALS_REJECTED,
            (
                f"Robot rejected the credentials in Secret {ref.name}; every Robot call of this account is stopped "
                "until the Secret changes (3 failed logins block the IP for 10 minutes)"
            ),
            digest,
        )
    try:
        servers = await robot.cached_servers()
    except robot_errors.RobotAuthError:
        return False, c.Reason.CREDENTIALS_REJECTED, f"Robot rejected the credentials in Secret {ref.name}", digest
    except (robot_errors.RobotRequeue, robot_errors.RobotTransientError) as exc:
        return False, c.Reason.ROBOT_UNAVAILABLE, f"Robot not answering yet: {exc}", digest
    return True, c.Reason.READY, f"{len(servers)} servers in the account", digest


async def _control_plane_ips(deps: Deps, hgc: HetznerGPUCluster, ns: str, cluster: str) -> list[str]:
    machines = await deps.kube.list(
        CAPI_MACHINES, ns, label_selector=f"{domain.CLUSTER_NAME_LABEL}={cluster},cluster.x-k8s.io/control-plane"
    )
    ips = []
    for m in machines:
        for a in (m.get("status") or {}).get("addresses", []):
            if a.get("type") == "ExternalIP" and ":" not in a.get("address", ""):
                ips.append(a["address"])
    return sorted(set(ips))


async def _load_balancer(deps: Deps, hgc: HetznerGPUCluster, ns: str, cluster: str) -> tuple[bool, str, str]:
    lb = hgc.spec.control_plane_load_balancer
    if hgc.spec.cluster_ref is not None:  # add-on mode: the Cluster's own provider fronts its control plane
        return True, c.Reason.ADD_ON, f"GPU workers of Cluster {hgc.spec.cluster_ref.name}"
    if not lb.enabled:
        return True, c.Reason.LOAD_BALANCER_DISABLED, "no Load Balancer requested"
    if lb.token_ref is None:
        return False, c.Reason.SECRET_MISSING, "controlPlaneLoadBalancer.tokenRef is required"
    secret = await deps.kube.get_or_none(SECRETS, lb.token_ref.name, ns)
    if secret is None:
        return False, c.Reason.SECRET_MISSING, f"hcloud token Secret {lb.token_ref.name} not found"
    token = secret_value(secret, lb.token_ref.password_key, "hcloud token")
    api = cloud.HCloudLoadBalancers(token, api_endpoint=deps.settings.hcloud_endpoint or "https://api.hetzner.cloud/v1")
    name = lb.name or f"{cluster}-kube-apiserver"
    try:
        ep = await api.ensure(
            cloud.LoadBalancerSpec(name=name, location=lb.location, lb_type=lb.type, port=lb.port),
            await _control_plane_ips(deps, hgc, ns, cluster),
        )
    except cloud.CloudError as exc:
        return False, c.Reason.LOAD_BALANCER_FAILED, f"hcloud: {exc}"
    hgc.spec.control_plane_endpoint = APIEndpoint(host=ep.host, port=ep.port)
    return True, c.Reason.READY, f"{name} at {ep.host}:{ep.port}"


async def _attach(deps: Deps, obj: Obj, hgc: HetznerGPUCluster, owner: Obj | None) -> float | None:
    """Add-on mode, until it has an owner (None: nothing to do): make the named Cluster this object's owner,
    as CAPI does for its infrastructureRef, so everything that finds a HetznerGPUCluster's Cluster by its
    owner (the gate, the add-ons, the claim scaler) and clusterctl move (which follows owners) treat it
    alike. Not a controller reference: the Cluster's controller is its own infrastructure provider's."""
    if owner is not None or hgc.spec.cluster_ref is None:
        return None
    meta, cluster_name = obj["metadata"], hgc.spec.cluster_ref.name
    ns, name, now = meta["namespace"], meta["name"], deps.clock()
    cluster = await deps.kube.get_or_none(CAPI_CLUSTERS, cluster_name, ns)
    if pause.is_paused(cluster, obj):
        return 60.0  # CAPI's rule, as every loop: a paused Cluster (a move's source or target) gets no write
    if cluster is None:
        msg = f"spec.clusterRef names Cluster {cluster_name}, which does not exist in {ns} (yet)"
        conds = c.set_condition(hgc.status.conditions, c.Type.READY, False, c.Reason.CLUSTER_NOT_FOUND, msg, now)
        if [x.model_dump() for x in conds] != [x.model_dump() for x in hgc.status.conditions]:
            await deps.kube.patch(
                CLUSTERS, name, {"status": {"conditions": [x.wire() for x in conds]}}, ns, sub="status"
            )
            events.emit(obj, c.Reason.CLUSTER_NOT_FOUND, msg, warning=True)
        return 30.0
    ref = {
        "apiVersion": domain.CAPI_API_VERSION,
        "kind": "Cluster",
        "name": cluster_name,
        "uid": cluster["metadata"]["uid"],
    }
    labels = {domain.CLUSTER_NAME_LABEL: cluster_name}
    patch = {"metadata": {"ownerReferences": [*(meta.get("ownerReferences") or []), ref], "labels": labels}}
    patch["metadata"]["resourceVersion"] = meta["resourceVersion"]  # another writer's owner list is not lost
    await deps.kube.patch(CLUSTERS, name, patch, ns)
    events.emit(obj, "AttachedToCluster", f"GPU workers attached to Cluster {cluster_name} (add-on mode)")
    return 0.2


def _publish(hgc: HetznerGPUCluster, status: HetznerGPUClusterStatus, ready: bool) -> None:
    """What the InfraCluster contract has CAPI read: failure domains, and provisioned once ready. In add-on
    mode nobody reads them (CAPI reads the Cluster's infrastructureRef), and the webhook refuses domains."""
    status.failure_domains = [FailureDomain(name=fd, control_plane=True) for fd in hgc.spec.failure_domains]
    if ready and hgc.spec.cluster_ref is None:
        status.initialization.provisioned = True


async def _write_endpoint(deps: Deps, hgc: HetznerGPUCluster, obj: Obj) -> None:
    """The Load Balancer's endpoint into the spec, when it changed."""
    endpoint = hgc.spec.control_plane_endpoint
    if endpoint is not None and obj["spec"].get("controlPlaneEndpoint") != endpoint.wire():
        meta = obj["metadata"]
        await deps.kube.patch(
            CLUSTERS, meta["name"], {"spec": {"controlPlaneEndpoint": endpoint.wire()}}, meta["namespace"]
        )


def _ready(
    conds: list[Condition], parts: list[tuple[bool, str, str]], now: datetime, gen: int | None
) -> tuple[list[Condition], bool]:
    """Ready: the first part that is not, with its reason and message; else the Load Balancer's message."""
    failing = next((part for part in parts if not part[0]), None)
    if failing is None:
        return c.set_condition(conds, c.Type.READY, True, c.Reason.READY, parts[1][2], now, gen), True
    return c.set_condition(conds, c.Type.READY, False, failing[1], failing[2], now, gen), False


def _credential_events(deps: Deps, obj: Obj, written: HetznerGPUClusterStatus, ok: bool, reason: str, msg: str) -> None:
    before = c.get(written.conditions, c.Type.ROBOT_CREDENTIALS_VALID)
    if not ok and (before is None or before.reason != reason):
        events.emit(obj, reason, msg, warning=True)
    if ok and before is not None and before.reason == c.Reason.CREDENTIALS_REJECTED:
        # The Secret was fixed: the hosts that deferred on the open circuit go on now, not at their next poll.
        events.emit(obj, "CredentialsAccepted", "Robot accepted the credentials again; Robot calls resume")
        deps.wakeups.wake_all("host", obj["metadata"]["namespace"])


def _network_event(obj: Obj, written: HetznerGPUClusterStatus, network: cluster_vswitch.Outcome) -> None:
    """A Warning when the vSwitch becomes unusable (or for another reason): once per cause, not per pass."""
    before = c.get(written.conditions, c.Type.PRIVATE_NETWORK_READY)
    if not network.ok and (before is None or before.reason != network.reason):
        events.emit(obj, network.reason, network.message, warning=True)


async def reconcile(deps: Deps, namespace: str, name: str) -> float | None:
    obj = await deps.kube.get_or_none(CLUSTERS, name, namespace)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    hgc = HetznerGPUCluster.model_validate(obj)
    owner = next((o for o in obj["metadata"].get("ownerReferences", []) if o.get("kind") == "Cluster"), None)
    if (attaching := await _attach(deps, obj, hgc, owner)) is not None:
        return attaching
    cluster = await deps.kube.get_or_none(CAPI_CLUSTERS, owner["name"], namespace) if owner else None
    now, gen = deps.clock(), obj["metadata"].get("generation")
    conds = hgc.status.conditions
    paused = pause.is_paused(cluster, obj)
    conds = c.set_condition(
        conds, c.Type.PAUSED, paused, c.Reason.PAUSED if paused else c.Reason.NOT_PAUSED, "", now, gen
    )
    if paused:  # one write when it changes, then none: the source of a clusterctl move stays still
        if [x.model_dump() for x in conds] != [x.model_dump() for x in hgc.status.conditions]:
            await deps.kube.patch(
                CLUSTERS, name, {"status": {"conditions": [x.wire() for x in conds]}}, namespace, sub="status"
            )
        return 60.0
    ok, reason, msg, digest = await _credentials(deps, hgc, namespace)
    conds = c.set_condition(conds, c.Type.ROBOT_CREDENTIALS_VALID, ok, reason, msg, now, gen)
    lb_ok, lb_reason, lb_msg = await _load_balancer(deps, hgc, namespace, owner["name"] if owner else name)
    conds = c.set_condition(conds, c.Type.LOAD_BALANCER_READY, lb_ok, lb_reason, lb_msg, now, gen)
    await _write_endpoint(deps, hgc, obj)
    # The vSwitch after the credentials (its calls need them), before Ready (hosts can't join without it).
    network = await cluster_vswitch.ensure(deps, hgc, obj) if ok else None
    parts = [(ok, str(reason), msg), (lb_ok, str(lb_reason), lb_msg)]
    if network is not None:
        parts.append((network.ok, network.reason, network.message))
        conds = c.set_condition(conds, c.Type.PRIVATE_NETWORK_READY, *parts[-1], now, gen)
    conds, ready = _ready(conds, parts, now, gen)
    written = hgc.status.model_copy(deep=True)
    hgc.status.conditions = conds  # the add-ons' conditions build on these
    addons = await cluster_addons.reconcile(deps, hgc, obj, owner["name"]) if owner else None
    if addons is not None:
        conds = addons.conditions
    status = hgc.status.model_copy(update={"conditions": conds, "credentials_hash": digest})
    if addons is not None:
        status.addons = addons.status
    if network is not None:
        status.private_network = network.status
        _network_event(obj, written, network)
    _publish(hgc, status, ready)
    # Against what was read, not hgc.status (which now holds this pass's conditions): a condition that alone
    # changed (credentials rejected, the Load Balancer failing) must still be written.
    if status.model_dump() != written.model_dump():
        await deps.kube.patch(
            CLUSTERS, name, {"status": status.model_dump(by_alias=True, mode="json")}, namespace, sub="status"
        )
        _credential_events(deps, obj, written, ok, str(reason), msg)
    requeue = 300.0 if ready else 30.0
    if owner is None:
        # CAPI sets the ownerReference a moment after the object exists, and a metadata change doesn't wake
        # this loop: a full poll later meant a cluster applied after the operator started waited 5 min for
        # its add-ons (found by the release-install worlds, where the operator runs before the cluster).
        return OWNER_WAIT_S
    return min(requeue, addons.requeue) if addons is not None and addons.requeue is not None else requeue


async def run(deps: Deps, namespace: str, name: str, stopped: Any) -> None:
    await loops.run("cluster", reconcile, deps, namespace, name, stopped)
