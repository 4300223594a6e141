"""Scale-from-zero with both scalers running at once: the real cluster-autoscaler 1.36.1 and the claim-aware scaler
(``--claim-scaler-pods ca-declined``), on disjoint MachineDeployments, never add two nodes for one claim.

The world: ``dev-gpu`` (all-1g.24gb) and ``dev-ca-whole`` (MIG off, annotated for scale from zero as
``capi-gpu autoscaler annotate`` writes it: ``dra-driver: gpu.nvidia.com``, ``gpu-count: 1``) are CA's (min 0,
owner label in CA's discovery filter); ``dev-cs-mig`` (all-1g.24gb) and ``dev-cs-whole`` (MIG off) are the claim
scaler's (min 0, max 1). CA sees one ``dev-gpu`` node
for over a minute (it keeps that node as the group's template, its node-info cache), then the group goes to
zero. A 1g.24gb claim pod and a whole-GPU claim pod are submitted together. What CA 1.36.1 does: it scales
``dev-gpu`` 0->1 for the MIG pod from its cached node (TriggeredScaleUp) and declines the whole-GPU pod
(NotTriggerScaleUp: its MIG group's node offers no whole GPU, and for ``dev-ca-whole``, at zero and never seen
with a node, it logs ``cannot allocate all claims``: the synthetic slice has no resourceSliceCount,
kubernetes/autoscaler#10199, and no gate device). The claim scaler leaves the MIG pod to CA, although its
own ``dev-cs-mig`` offers 1g.24gb (the double provisioning found before this rule), and raises ``dev-cs-whole``
0->1 for the pod CA declined. Two claims, two new nodes, each pod bound on the group of the scaler that served it.
"""

from __future__ import annotations

import copy
import datetime as dt
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ca_kit import all_bound, ca_sees_ready, owner_labelled, pods, replicas, set_group_size, set_owner, submit
from flow_kit import MD_NAME, gpu_nodes, ns, provisioned, robot_refusals, wait, where

from capi_gpu import domain
from capi_gpu.autoscaler import annotations, nodegroup
from capi_gpu.kube import CAPI_MACHINEDEPLOYMENTS, CAPI_MACHINES, EVENTS, NODES, RESOURCECLAIMTEMPLATES, ours
from capi_gpu_sim.cluster_autoscaler import ClusterAutoscaler, Options
from capi_gpu_sim.world import World

TEMPLATES = ours("hetznergpumachinetemplates")
CS_MIG, CS_WHOLE, CA_WHOLE, WHOLE_TEMPLATE = "dev-cs-mig", "dev-cs-whole", "dev-ca-whole", "whole-gpu"
TIMEOUT_S = 300.0
STABLE_S = 62.0  # CA copies a node as its group's template once it has been Ready for a minute


def whole_gpu_template() -> dict[str, Any]:
    """A whole GPU (NVIDIA's gpu.nvidia.com class) and our gate device, as the shipped MIG templates pair them."""
    gate = {"deviceClassName": "gate.gpu.infrastructure.cluster.x-k8s.io", "allocationMode": "ExactCount", "count": 1}
    gpu = {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}
    requests = [{"name": "gpu", "exactly": gpu}, {"name": "gate", "exactly": gate}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": WHOLE_TEMPLATE},
        "spec": {"spec": {"devices": {"requests": requests}}},
    }


def scaled_md(world: World, name: str, template: str, owner: str) -> None:
    """A copy of dev-gpu at zero (min 0, max 1), cloning from ``template``, owned by ``owner`` (annotation and
    label, the label also on its Machines: CA's discovery filter reads it there too)."""
    md = copy.deepcopy(world.k.get(CAPI_MACHINEDEPLOYMENTS, MD_NAME, ns(world)))
    mark = {domain.ANNOTATION_SCALER_OWNER: owner}
    spec = md["spec"]
    spec["replicas"] = 0
    spec["selector"] = {"matchLabels": {domain.CAPI_DEPLOYMENT_NAME_LABEL: name}}
    spec["template"]["metadata"] = {"labels": {domain.CAPI_DEPLOYMENT_NAME_LABEL: name, **mark}}
    spec["template"]["spec"]["infrastructureRef"]["name"] = template
    ann = {domain.CA_MIN_SIZE_ANNOTATION: "0", domain.CA_MAX_SIZE_ANNOTATION: "1", **mark}
    meta = {"name": name, "annotations": ann, "labels": mark}
    world.k.create(
        CAPI_MACHINEDEPLOYMENTS,
        {"apiVersion": md["apiVersion"], "kind": md["kind"], "metadata": meta, "spec": spec},
        ns(world),
    )


def ca_annotations(world: World, name: str, template: str) -> dict[str, str]:
    """What ``capi-gpu autoscaler annotate`` writes for scale from zero (dra-driver gpu.nvidia.com, gpu-count,
    cpu, memory, labels, the startup taint), once the template controller gave the template its capacity."""
    tpl = wait(
        world,
        f"{template}'s status.capacity",
        lambda: (t := world.k.get(TEMPLATES, template, ns(world))) and (t.get("status") or {}).get("capacity") and t,
        120,
    )
    md = world.k.get(CAPI_MACHINEDEPLOYMENTS, name, ns(world))
    patch = annotations.merge_patch(md, annotations.desired(md, nodegroup.node_shape(tpl)))
    assert patch is not None
    world.k.patch(CAPI_MACHINEDEPLOYMENTS, name, patch, ns(world))
    got: dict[str, str] = world.k.get(CAPI_MACHINEDEPLOYMENTS, name, ns(world))["metadata"]["annotations"]
    return got


def whole_gpu_machine_template(world: World) -> None:
    tpl = world.k.get(TEMPLATES, MD_NAME, ns(world))
    spec = copy.deepcopy(tpl["spec"])
    spec["template"]["spec"]["gpu"].pop("layout", None)  # MIG off: the node offers its GPU whole
    body = {"apiVersion": tpl["apiVersion"], "kind": tpl["kind"], "metadata": {"name": CS_WHOLE}, "spec": spec}
    world.k.create(TEMPLATES, body, ns(world))


@pytest.fixture(scope="module")
def world(world_factory: Callable[..., World]) -> World:
    w = world_factory(
        hosts=3,
        layout="all-1g.24gb",
        operator_args=["--claim-scaler", "--claim-scaler-pods", "ca-declined"],
        release=True,
    )
    set_group_size(w, MD_NAME, 0, 1)
    set_owner(w, MD_NAME, "cluster-autoscaler")
    whole_gpu_machine_template(w)
    scaled_md(w, CS_MIG, MD_NAME, "claim-scaler")
    scaled_md(w, CS_WHOLE, CS_WHOLE, "claim-scaler")
    scaled_md(w, CA_WHOLE, CS_WHOLE, "cluster-autoscaler")
    w.k.create(RESOURCECLAIMTEMPLATES, whole_gpu_template(), ns(w))
    provisioned(w, 1)
    ann = ca_annotations(w, CA_WHOLE, CS_WHOLE)
    assert ann[domain.CA_CAPACITY_DRA_DRIVER] == domain.NVIDIA_DRIVER and ann[domain.CA_CAPACITY_GPU_COUNT] == "1"
    wait(w, "the owner label on dev-gpu's Machines", lambda: owner_labelled(w, MD_NAME, "cluster-autoscaler"), 60)
    return w


def ready_for(node: dict[str, Any]) -> float:
    """Seconds the Node's Ready condition has been True (API clock)."""
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            since = dt.datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00"))
            return (dt.datetime.now(dt.UTC) - since).total_seconds()
    return 0.0


@pytest.fixture(scope="module")
def ca(world: World) -> Iterator[ClusterAutoscaler]:
    (node,) = gpu_nodes(world)
    wait(
        world,
        "dev-gpu's node Ready for a minute",
        lambda: ready_for(world.k.get(NODES, node["metadata"]["name"])) > STABLE_S,
        120,
    )
    opts = Options(
        namespace=ns(world),
        cluster=world.config.cluster,
        state_dir=world.config.state_dir,
        discovery_extra=f"{domain.LABEL_SCALER_OWNER}=cluster-autoscaler",
    )
    autoscaler = ClusterAutoscaler(world.k, world.cp.kubeconfig, opts).start()
    try:
        wait(
            world, "cluster-autoscaler counting dev-gpu's node ready", lambda: ca_sees_ready(world, autoscaler, 1), 120
        )
        yield autoscaler
    finally:
        autoscaler.stop()
        print(f"\ncluster-autoscaler log: {autoscaler.log_path}")


def group_of_node(world: World, node: str) -> str | None:
    for m in world.k.list(CAPI_MACHINES, ns(world)):
        if ((m.get("status") or {}).get("nodeRef") or {}).get("name") == node:
            return (m["metadata"].get("labels") or {}).get(domain.CAPI_DEPLOYMENT_NAME_LABEL)
    return None


def verdicts(world: World, pod: str) -> list[str]:
    return [
        str(e.get("reason"))
        for e in world.k.list(EVENTS, ns(world))
        if e["involvedObject"].get("name") == pod and e.get("reason") in ("TriggeredScaleUp", "NotTriggerScaleUp")
    ]


def first(world: World, reason: str, name: str) -> dt.datetime | None:
    stamps = [
        dt.datetime.fromisoformat(str(e.get("firstTimestamp") or e.get("eventTime")).replace("Z", "+00:00"))
        for e in world.k.list(EVENTS, ns(world))
        if e.get("reason") == reason and e["involvedObject"].get("name") == name
    ]
    return min(stamps) if stamps else None


def sizes(world: World) -> dict[str, int]:
    return {md: replicas(world, md) for md in (MD_NAME, CA_WHOLE, CS_MIG, CS_WHOLE)}


def test_each_claim_gets_one_node_from_the_scaler_that_can_serve_it(world: World, ca: ClusterAutoscaler) -> None:
    # CA has its copy of the node now; the group goes to zero (as CA itself would after its unneeded time).
    world.scale(0, MD_NAME)
    wait(world, "dev-gpu at zero, its node gone", lambda: not gpu_nodes(world), 180)
    assert sizes(world) == {MD_NAME: 0, CA_WHOLE: 0, CS_MIG: 0, CS_WHOLE: 0}
    started = time.monotonic()
    submit(world, ["mig"], "mig-1g-24gb")
    submit(world, ["whole"], WHOLE_TEMPLATE)
    bound = wait(world, "both pods bound through the gate", lambda: all_bound(world, ["mig", "whole"]), TIMEOUT_S)
    took = time.monotonic() - started
    # The gate readies a node by its HetznerGPUMachine's providerID; CAPI sets the Machine's nodeRef on its own
    # schedule (CI saw a pod bound 1.5 s before it), so the group is read once CAPI has caught up.
    served = wait(
        world,
        "the bound nodes' Machines to carry their nodeRef",
        lambda: s if all((s := {rs: group_of_node(world, node) for rs, node in bound.items()}).values()) else None,
        60,
    )
    assert served == {"mig": MD_NAME, "whole": CS_WHOLE}, (served, where(world))
    time.sleep(10)  # five more CA loops and claim-scaler passes: nothing else is added
    assert sizes(world) == {MD_NAME: 1, CA_WHOLE: 0, CS_MIG: 0, CS_WHOLE: 1}, "two claims, two new nodes"
    assert len(world.k.list(CAPI_MACHINES, ns(world))) == 2
    mig_pod, whole_pod = (pods(world)[rs]["metadata"]["name"] for rs in ("mig", "whole"))
    assert set(verdicts(world, mig_pod)) == {"TriggeredScaleUp"}, verdicts(world, mig_pod)
    assert set(verdicts(world, whole_pod)) == {"NotTriggerScaleUp"}, verdicts(world, whole_pod)
    scaled = [
        (e["involvedObject"]["name"], e.get("message"))
        for e in world.k.list(EVENTS, ns(world))
        if e.get("reason") == "ClaimScaleUp"
    ]
    assert scaled == [(CS_WHOLE, "0->1 for 1x gpu pending")], scaled
    # CA's own whole-GPU group at zero, annotated for it, cannot serve the claim (#10199; and no gate device).
    refused = [line for line in ca.log().splitlines() if CA_WHOLE in line and "cannot allocate all claims" in line]
    assert refused, f"no 'cannot allocate all claims' for {CA_WHOLE} in {ca.log_path}"
    logs = world.operator_logs()
    assert f"pod {ns(world)}/{mig_pod} left: cluster-autoscaler scales up for it" in logs
    assert robot_refusals(world) == [], where(world)
    created = min(
        dt.datetime.fromisoformat(p["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
        for p in pods(world).values()
    )
    ca_up, ca_no, cs_up = (
        first(world, "TriggeredScaleUp", mig_pod),
        first(world, "NotTriggerScaleUp", whole_pod),
        first(world, "ClaimScaleUp", CS_WHOLE),
    )
    assert ca_up and ca_no and cs_up and cs_up >= ca_no
    print(
        f"\nscale from zero, both scalers: CA TriggeredScaleUp for the 1g pod {(ca_up - created).total_seconds():.0f}s "
        f"after the pods were created (API clock), NotTriggerScaleUp for the whole-GPU pod after "
        f"{(ca_no - created).total_seconds():.0f}s, claim scaler raised {CS_WHOLE} "
        f"{(cs_up - ca_no).total_seconds():.0f}s after CA declined; both bound after {took:.0f}s; "
        f"served {served}; replicas {sizes(world)}"
    )
