"""Deleting a HetznerGPUCluster: the hcloud Load Balancer it created for the control-plane endpoint goes
with it (it is billed by the hour), and the object says ``Deleting`` while it does. A delete carrying
clusterctl's ``delete-for-move`` is a move, not a deletion: the Load Balancer keeps serving the cluster.
"""

from __future__ import annotations

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.cluster import HetznerGPUCluster
from capi_gpu.controllers import cluster_vswitch
from capi_gpu.hetzner import cloud
from capi_gpu.kube import SECRETS, Obj, ours
from capi_gpu.runtime import events
from capi_gpu.runtime.deps import AccessError, Deps, secret_value

CLUSTERS = ours("hetznergpuclusters")
HCLOUD_API = "https://api.hetzner.cloud/v1"
DELETING = "Deleting"  # condition type, as CAPI core's objects report a deletion in progress


def lb_name(hgc: HetznerGPUCluster, obj: Obj) -> str:
    """The Load Balancer's name, as ``cluster_loop`` creates it: spec name, else ``<cluster>-kube-apiserver``."""
    owner = next((o for o in obj["metadata"].get("ownerReferences", []) if o.get("kind") == "Cluster"), None)
    cluster = owner["name"] if owner else obj["metadata"]["name"]
    return hgc.spec.control_plane_load_balancer.name or f"{cluster}-kube-apiserver"


async def _report(deps: Deps, hgc: HetznerGPUCluster, obj: Obj, ok: bool, message: str) -> None:
    """Deleting=True and Ready=False/Deleting while the Load Balancer goes (or cannot go, and why)."""
    now, gen = deps.clock(), obj["metadata"].get("generation")
    conds = c.set_condition(hgc.status.conditions, DELETING, True, c.Reason.DELETING, message, now, gen)
    conds = c.set_condition(conds, c.Type.READY, False, c.Reason.DELETING, message, now, gen)
    if not ok:
        conds = c.set_condition(
            conds, c.Type.LOAD_BALANCER_READY, False, c.Reason.LOAD_BALANCER_FAILED, message, now, gen
        )
    if [x.model_dump() for x in conds] != [x.model_dump() for x in hgc.status.conditions]:
        meta = obj["metadata"]
        body = {"status": {"conditions": [x.wire() for x in conds]}}
        await deps.kube.patch(CLUSTERS, meta["name"], body, meta["namespace"], sub="status")
        hgc.status.conditions = conds


async def delete(deps: Deps, obj: Obj) -> bool:
    """True once the finalizer may go: nothing to delete, a move, or the Load Balancer is gone."""
    if domain.DELETE_FOR_MOVE_ANNOTATION in (obj["metadata"].get("annotations") or {}):
        return True
    hgc = HetznerGPUCluster.model_validate(obj)
    done, why = await cluster_vswitch.release(deps, hgc, obj)
    if not done:  # its members leave as their machines are deleted; the vSwitch goes after them
        await _report(deps, hgc, obj, True, why)
        return False
    lb = hgc.spec.control_plane_load_balancer
    if not lb.enabled or lb.token_ref is None:
        return True
    name, ns = lb_name(hgc, obj), obj["metadata"]["namespace"]
    await _report(deps, hgc, obj, True, f"deleting hcloud Load Balancer {name}")
    try:
        secret = await deps.kube.get_or_none(SECRETS, lb.token_ref.name, ns)
        if secret is None:
            raise AccessError("SecretMissing", f"hcloud token Secret {lb.token_ref.name} not found")
        token = secret_value(secret, lb.token_ref.password_key, "hcloud token")
        api = cloud.HCloudLoadBalancers(token, api_endpoint=deps.settings.hcloud_endpoint or HCLOUD_API)
        deleted = await api.delete(name)
    except (AccessError, cloud.CloudError) as exc:
        msg = f"cannot delete hcloud Load Balancer {name} yet: {exc}; retrying"
        await _report(deps, hgc, obj, False, msg)
        events.emit(obj, "LoadBalancerDeleteFailed", msg, warning=True)
        return False
    events.emit(obj, "LoadBalancerDeleted", f"hcloud Load Balancer {name} {'deleted' if deleted else 'was gone'}")
    return True
