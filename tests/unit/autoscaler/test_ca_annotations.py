"""CA annotations from a MachineDeployment and its template: capacity, the two GPU forms (DRA, device plugin),
none for a MIG layout, labels and the startup taint (others' entries kept), the owner annotation and label,
merge patches (removals, no-op), and node-group parsing: bounds, owner, cost, template ref, node shape,
coming replicas."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from capi_gpu import domain
from capi_gpu.autoscaler import annotations as ca_annotations
from capi_gpu.autoscaler import nodegroup
from capi_gpu.autoscaler.annotations import GpuResource
from capi_gpu.autoscaler.nodegroup import NotAGroup, ScaleOwner
from capi_gpu.gpu.packing import WHOLE_GPU

CAPACITY = {"cpu": "48", "memory": "257614Mi", "ephemeral-storage": "894Gi", "nvidia.com/gpu": "1"}


def template(gpu: dict[str, Any] | None, capacity: dict[str, str] | None = CAPACITY) -> dict[str, Any]:
    """A HetznerGPUMachineTemplate as the apiserver returns it after the template controller's pass."""
    spec: dict[str, Any] = {"hostSelector": {"matchLabels": {domain.LABEL_GPU_PRESENT: "true"}}}
    if gpu is not None:
        spec["gpu"] = gpu
    obj: dict[str, Any] = {
        "apiVersion": domain.API_VERSION,
        "kind": "HetznerGPUMachineTemplate",
        "metadata": {"name": "c1-gpu", "namespace": "team-a", "resourceVersion": "812", "generation": 1},
        "spec": {"template": {"spec": spec}},
        "status": {"matchingHosts": 2, "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"}},
    }
    if capacity is not None:
        obj["status"]["capacity"] = capacity
    return obj


def machinedeployment(annotations_: dict[str, str] | None = None, replicas: int = 0) -> dict[str, Any]:
    ann = {domain.CA_MIN_SIZE_ANNOTATION: "0", domain.CA_MAX_SIZE_ANNOTATION: "3", **(annotations_ or {})}
    return {
        "apiVersion": domain.CAPI_API_VERSION,
        "kind": "MachineDeployment",
        "metadata": {
            "name": "c1-gpu",
            "namespace": "team-a",
            "resourceVersion": "900",
            "annotations": ann,
            "labels": {domain.CLUSTER_NAME_LABEL: "c1"},
        },
        "spec": {
            "clusterName": "c1",
            "replicas": replicas,
            "template": {
                "spec": {
                    "clusterName": "c1",
                    "infrastructureRef": {
                        "apiGroup": domain.GROUP,
                        "kind": "HetznerGPUMachineTemplate",
                        "name": "c1-gpu",
                    },
                }
            },
        },
    }


BALANCED = {"model": "rtx-pro-6000", "layout": {"preset": "all-balanced"}}
WHOLE = {"model": "rtx-pro-6000"}


def test_mig_layout_capacity_labels_taint_and_no_gpu_advertisement() -> None:
    shape = nodegroup.node_shape(template(BALANCED))
    want = ca_annotations.desired(machinedeployment(), shape)
    assert want.present() == {
        domain.CA_CAPACITY_CPU: "48",
        domain.CA_CAPACITY_MEMORY: "257614Mi",
        domain.CA_CAPACITY_EPHEMERAL_DISK: "894Gi",
        domain.CA_CAPACITY_MAX_PODS: "110",
        domain.CA_CAPACITY_LABELS: "gpu.infrastructure.cluster.x-k8s.io/gpu=true,"
        "gpu.infrastructure.cluster.x-k8s.io/mig-layout=2x1g.24gb_1x2g.48gb",
        domain.CA_CAPACITY_TAINTS: "readiness.k8s.io/gpu-not-ready:NoSchedule",
    }
    assert {k: v for k, v in want.annotations.items() if v is None} == dict.fromkeys(ca_annotations.GPU_KEYS)
    assert "10199" in want.notes[0]
    assert want.labels == {}


@pytest.mark.parametrize(
    ("form", "gpu"),
    [
        (GpuResource.DRA, {domain.CA_CAPACITY_DRA_DRIVER: "gpu.nvidia.com", domain.CA_CAPACITY_GPU_COUNT: "1"}),
        (GpuResource.DEVICE_PLUGIN, {domain.CA_CAPACITY_GPU_TYPE: "nvidia.com/gpu", domain.CA_CAPACITY_GPU_COUNT: "1"}),
    ],
)
def test_whole_gpu_node_advertises_its_gpu_in_one_form(form: GpuResource, gpu: dict[str, str]) -> None:
    want = ca_annotations.desired(machinedeployment(), nodegroup.node_shape(template(WHOLE)), gpu_resource=form)
    present = want.present()
    assert {k: present[k] for k in ca_annotations.GPU_KEYS if k in present} == gpu
    assert "mig-layout=none" in present[domain.CA_CAPACITY_LABELS]
    assert not want.notes


def test_the_form_in_use_is_kept() -> None:
    assert ca_annotations.gpu_resource_of(machinedeployment()) is GpuResource.DRA
    md = machinedeployment({domain.CA_CAPACITY_GPU_TYPE: "nvidia.com/gpu"})
    assert ca_annotations.gpu_resource_of(md) is GpuResource.DEVICE_PLUGIN


def test_other_labels_and_taints_in_the_annotations_are_kept() -> None:
    md = machinedeployment(
        {
            domain.CA_CAPACITY_LABELS: "team=ml,cluster-api/accelerator=wrong",
            domain.CA_CAPACITY_TAINTS: "dedicated=ml:NoSchedule,readiness.k8s.io/gpu-not-ready=x:NoExecute",
        }
    )
    want = ca_annotations.desired(md, nodegroup.node_shape(template(BALANCED))).present()
    # CA's accelerator label, which older versions of this tool wrote, goes (CA would count the node unready).
    assert want[domain.CA_CAPACITY_LABELS].split(",") == [
        "gpu.infrastructure.cluster.x-k8s.io/gpu=true",
        "gpu.infrastructure.cluster.x-k8s.io/mig-layout=2x1g.24gb_1x2g.48gb",
        "team=ml",
    ]
    assert want[domain.CA_CAPACITY_TAINTS] == "dedicated=ml:NoSchedule,readiness.k8s.io/gpu-not-ready:NoSchedule"


def test_owner_goes_on_as_annotation_and_label() -> None:
    want = ca_annotations.desired(
        machinedeployment(), nodegroup.node_shape(template(BALANCED)), owner=ScaleOwner.CLAIM_SCALER, max_pods=64
    )
    assert want.annotations[domain.ANNOTATION_SCALER_OWNER] == "claim-scaler"
    assert want.annotations[domain.CA_CAPACITY_MAX_PODS] == "64"
    assert want.labels == {domain.LABEL_SCALER_OWNER: "claim-scaler"}


def test_no_capacity_yet_is_incomplete() -> None:
    with pytest.raises(ca_annotations.Incomplete, match=r"status\.capacity"):
        ca_annotations.desired(machinedeployment(), nodegroup.node_shape(template(BALANCED, capacity=None)))


def test_merge_patch_sets_changes_removes_stale_gpu_keys_and_is_none_when_current() -> None:
    md = machinedeployment({domain.CA_CAPACITY_DRA_DRIVER: "gpu.nvidia.com", domain.CA_CAPACITY_CPU: "8"})
    want = ca_annotations.desired(md, nodegroup.node_shape(template(BALANCED)), owner=ScaleOwner.CLAIM_SCALER)
    patch = ca_annotations.merge_patch(md, want)
    assert patch is not None
    ann = patch["metadata"]["annotations"]
    assert ann[domain.CA_CAPACITY_CPU] == "48"
    assert ann[domain.CA_CAPACITY_DRA_DRIVER] is None  # a MIG node must not promise whole GPUs
    assert domain.CA_CAPACITY_GPU_TYPE not in ann  # absent already: nothing to remove
    assert patch["metadata"]["labels"] == {domain.LABEL_SCALER_OWNER: "claim-scaler"}
    # Also on the Machines (through the template): CA 1.36.1 filters Machines and MachineSets by the label too.
    assert patch["spec"] == {"template": {"metadata": {"labels": {domain.LABEL_SCALER_OWNER: "claim-scaler"}}}}
    applied = copy.deepcopy(md)
    applied["metadata"]["annotations"] = {k: v for k, v in {**md["metadata"]["annotations"], **ann}.items() if v}
    applied["metadata"]["labels"].update(patch["metadata"]["labels"])
    applied["spec"].setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {}).update(
        patch["spec"]["template"]["metadata"]["labels"]
    )
    assert ca_annotations.merge_patch(applied, want) is None


@pytest.mark.parametrize(
    ("ann", "bounds"),
    [
        ({}, nodegroup.Bounds(0, 3)),
        ({domain.CA_MAX_SIZE_ANNOTATION: "x"}, None),
        ({domain.CA_MIN_SIZE_ANNOTATION: "4"}, None),  # min > max
        ({domain.CA_MIN_SIZE_ANNOTATION: "-1"}, None),
    ],
)
def test_bounds_as_cluster_autoscaler_parses_them(ann: dict[str, str], bounds: nodegroup.Bounds | None) -> None:
    assert nodegroup.bounds(machinedeployment(ann)) == bounds


def test_bounds_need_both_annotations() -> None:
    md = machinedeployment()
    del md["metadata"]["annotations"][domain.CA_MAX_SIZE_ANNOTATION]
    assert nodegroup.bounds(md) is None


@pytest.mark.parametrize(
    ("value", "owner"),
    [
        (None, ScaleOwner.CLUSTER_AUTOSCALER),
        ("claim-scaler", ScaleOwner.CLAIM_SCALER),
        ("cluster-autoscaler", ScaleOwner.CLUSTER_AUTOSCALER),
        ("karpenter", None),
    ],
)
def test_owner_defaults_to_cluster_autoscaler_and_unknown_is_nobodys(
    value: str | None, owner: ScaleOwner | None
) -> None:
    md = machinedeployment({domain.ANNOTATION_SCALER_OWNER: value} if value else None)
    assert nodegroup.owner(md) is owner


@pytest.mark.parametrize(
    ("annotation", "label", "owner"),
    [
        ("claim-scaler", "claim-scaler", ScaleOwner.CLAIM_SCALER),
        ("claim-scaler", None, ScaleOwner.CLAIM_SCALER),
        ("claim-scaler", "cluster-autoscaler", None),  # CA's discovery filter takes it: never the claim scaler's
        (None, "claim-scaler", None),  # the annotation's default (CA) and the label disagree
        (None, "cluster-autoscaler", ScaleOwner.CLUSTER_AUTOSCALER),
        ("cluster-autoscaler", "cluster-autoscaler", ScaleOwner.CLUSTER_AUTOSCALER),
    ],
)
def test_owner_label_must_agree_with_the_annotation(
    annotation: str | None, label: str | None, owner: ScaleOwner | None
) -> None:
    md = machinedeployment({domain.ANNOTATION_SCALER_OWNER: annotation} if annotation else None)
    if label is not None:
        md["metadata"].setdefault("labels", {})[domain.LABEL_SCALER_OWNER] = label
    assert nodegroup.owner(md) is owner


@pytest.mark.parametrize(
    ("value", "cost"), [(None, None), ("2.3995", 2.3995), ("-1", None), ("nan", None), ("€", None)]
)
def test_cost_annotation(value: str | None, cost: float | None) -> None:
    md = machinedeployment({domain.ANNOTATION_SCALE_COST: value} if value else None)
    assert nodegroup.cost(md) == cost


def test_template_ref_must_be_ours() -> None:
    assert nodegroup.template_name(machinedeployment()) == "c1-gpu"
    md = machinedeployment()
    md["spec"]["template"]["spec"]["infrastructureRef"]["kind"] = "AWSMachineTemplate"
    with pytest.raises(NotAGroup):
        nodegroup.template_name(md)


@pytest.mark.parametrize(
    ("gpu", "devices"),
    [
        (BALANCED, (("1g.24gb", 2), ("2g.48gb", 1))),
        ({"layout": {"profiles": {"2g.48gb": 2}}}, (("2g.48gb", 2),)),
        (WHOLE, ((WHOLE_GPU, 1),)),
    ],
)
def test_node_shape_resolves_the_layout_as_the_machine_controller_does(gpu: dict[str, Any], devices: Any) -> None:
    assert nodegroup.node_shape(template(gpu)).devices == devices


@pytest.mark.parametrize(
    ("gpu", "reason"),
    [
        (None, "no spec.template.spec.gpu"),
        ({"migMode": "Dynamic"}, "Dynamic MIG"),
        ({"layout": {"profiles": {"4g.96gb": 2}}}, "does not fit"),
    ],
)
def test_templates_that_are_not_a_plannable_gpu_group(gpu: dict[str, Any] | None, reason: str) -> None:
    with pytest.raises(NotAGroup, match=reason):
        nodegroup.node_shape(template(gpu))


def machine(name: str, node: str | None, deployment: str = "c1-gpu") -> dict[str, Any]:
    status = {"nodeRef": {"name": node}} if node else {}
    labels = {domain.CLUSTER_NAME_LABEL: "c1", domain.CAPI_DEPLOYMENT_NAME_LABEL: deployment}
    return {"metadata": {"name": name, "namespace": "team-a", "labels": labels}, "status": status}


def test_group_counts_replicas_whose_node_publishes_no_gpu_yet_as_coming() -> None:
    md = machinedeployment(
        {domain.ANNOTATION_SCALER_OWNER: "claim-scaler", domain.ANNOTATION_SCALE_COST: "2.4"}, replicas=3
    )
    machines = [machine("m1", "gex-1"), machine("m2", "gex-2"), machine("m3", None), machine("x", "gex-9", "other")]
    g = nodegroup.group(md, nodegroup.node_shape(template(BALANCED)), machines, gpu_nodes={"gex-1", "gex-9"})
    assert (g.name, g.replicas, g.min_size, g.max_size, g.owned, g.cost, g.coming) == ("c1-gpu", 3, 0, 3, True, 2.4, 2)
    assert g.headroom == 0
