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
from typing import Any

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.cluster import APIEndpoint, FailureDomain, HetznerGPUCluster
from capi_gpu.controllers import cluster_addons
from capi_gpu.hetzner import cloud
from capi_gpu.hetzner import errors as robot_errors
from capi_gpu.kube import CAPI_CLUSTERS, CAPI_MACHINES, SECRETS, ours
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


async def reconcile(deps: Deps, namespace: str, name: str) -> float | None:
    obj = await deps.kube.get_or_none(CLUSTERS, name, namespace)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    hgc = HetznerGPUCluster.model_validate(obj)
    owner = next((o for o in obj["metadata"].get("ownerReferences", []) if o.get("kind") == "Cluster"), None)
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
    if (
        hgc.spec.control_plane_endpoint is not None
        and obj["spec"].get("controlPlaneEndpoint") != hgc.spec.control_plane_endpoint.wire()
    ):
        await deps.kube.patch(
            CLUSTERS, name, {"spec": {"controlPlaneEndpoint": hgc.spec.control_plane_endpoint.wire()}}, namespace
        )
    ready = ok and lb_ok
    conds = c.set_condition(
        conds,
        c.Type.READY,
        ready,
        c.Reason.READY if ready else (reason if not ok else lb_reason),
        msg if not ok else lb_msg,
        now,
        gen,
    )
    hgc.status.conditions = conds
    addons = await cluster_addons.reconcile(deps, hgc, obj, owner["name"]) if owner else None
    if addons is not None:
        conds = addons.conditions
    status = hgc.status.model_copy(update={"conditions": conds, "credentials_hash": digest})
    if addons is not None:
        status.addons = addons.status
    status.failure_domains = [FailureDomain(name=fd, control_plane=True) for fd in hgc.spec.failure_domains]
    if ready:
        status.initialization.provisioned = True
    if status.model_dump() != hgc.status.model_dump():
        await deps.kube.patch(
            CLUSTERS, name, {"status": status.model_dump(by_alias=True, mode="json")}, namespace, sub="status"
        )
        before = c.get(hgc.status.conditions, c.Type.ROBOT_CREDENTIALS_VALID)
        if not ok and (before is None or before.reason != str(reason)):
            events.emit(obj, str(reason), msg, warning=True)
        if ok and before is not None and before.reason == c.Reason.CREDENTIALS_REJECTED:
            # The Secret was fixed: the hosts that deferred on the open circuit go on now, not at their next poll.
            events.emit(obj, "CredentialsAccepted", "Robot accepted the credentials again; Robot calls resume")
            deps.wakeups.wake_all("host", namespace)
    requeue = 300.0 if ready else 30.0
    if owner is None:
        # CAPI sets the ownerReference a moment after the object exists, and a metadata change doesn't wake
        # this loop: a full poll later meant a cluster applied after the operator started waited 5 min for
        # its add-ons (found by the release-install worlds, where the operator runs before the cluster).
        return OWNER_WAIT_S
    return min(requeue, addons.requeue) if addons is not None and addons.requeue is not None else requeue


async def run(deps: Deps, namespace: str, name: str, stopped: Any) -> None:
    await loops.run("cluster", reconcile, deps, namespace, name, stopped)
