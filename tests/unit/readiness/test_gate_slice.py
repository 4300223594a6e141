"""Gate ResourceSlice shape: driver name limits, node-local pool, one exclusive device per GPU device (so
cluster-autoscaler's per-pool utilisation sees the gate pool as busy as the GPU pool), binding conditions."""

from __future__ import annotations

import re

import pytest

from capi_gpu import domain
from capi_gpu.readiness import decisions

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QUALIFIED_NAME = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def test_gate_driver_name_is_a_valid_driver_name() -> None:
    # Driver names: DNS subdomain of at most 63 characters (resource.k8s.io validation).
    assert len(domain.GATE_DRIVER) <= 63
    assert all(DNS_LABEL.match(part) for part in domain.GATE_DRIVER.split("."))


@pytest.mark.parametrize("condition", [domain.GATE_BINDING_CONDITION, domain.GATE_FAILURE_CONDITION])
def test_condition_types_are_qualified_names(condition: str) -> None:
    prefix, name = condition.split("/")
    assert QUALIFIED_NAME.match(condition)
    assert len(name) <= 63 and len(prefix) <= 253


def test_gate_slice_shape() -> None:
    body = decisions.gate_slice("gex131-a", 3, node_uid="0b8e-uid")
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["kind"] == "ResourceSlice"
    assert body["metadata"] == {
        "name": f"gex131-a-{domain.GATE_DRIVER}",
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "gex131-a", "uid": "0b8e-uid", "controller": True}
        ],
    }
    spec = body["spec"]
    assert spec["driver"] == domain.GATE_DRIVER
    assert spec["pool"] == {"name": "gex131-a", "generation": 3, "resourceSliceCount": 1}
    assert spec["nodeName"] == "gex131-a"
    (device,) = spec["devices"]
    # Ready: a bare device, so kube-scheduler's PreBind has nothing to poll for (no 5 s wait per pod).
    assert device == {"name": "gate-0"}
    # nodeName already pins allocations to the node; bindsToNode would only repeat it.
    assert "bindsToNode" not in device
    # Exactly one of nodeName/nodeSelector/allNodes/perDeviceNodeSelection.
    assert not {"nodeSelector", "allNodes", "perDeviceNodeSelection"} & spec.keys()


def test_gate_slice_without_owner() -> None:
    assert "ownerReferences" not in decisions.gate_slice("n", 1)["metadata"]


def test_long_node_names_still_give_a_valid_slice_name() -> None:
    node = ".".join(["a" * 60] * 4)  # 243 characters: a valid node name
    name = decisions.gate_slice(node, 1)["metadata"]["name"]
    assert len(name) <= 253
    assert name != decisions.gate_slice(node[:-1] + "b", 1)["metadata"]["name"]
    assert decisions.gate_slice(node, 1)["spec"]["pool"]["name"] == node


def test_gate_slice_is_what_a_pool_reader_sees_as_one_complete_pool() -> None:
    (pool,) = decisions.current_pools([decisions.gate_slice("n", 2)], "n", domain.GATE_DRIVER).values()
    assert pool.complete
    assert set(pool.devices) == {"gate-0"}


def test_one_exclusive_gate_device_per_gpu_device_of_the_layout() -> None:
    # all-1g.24gb: four MIG devices, so four claims can each hold a gate device of their own; a claim
    # holding one of them makes the pool 25 % used in CA's eyes (allocated / published), as the MIG pool is.
    four = decisions.ExpectedPool(profiles={"1g.24gb": 4})
    assert decisions.gate_device_count(four) == 4
    assert decisions.gate_device_count(decisions.ExpectedPool(full_gpus=1)) == 1
    assert decisions.gate_device_count(decisions.ExpectedPool()) == 1
    devices = decisions.gate_slice("n", 1, devices=4)["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gate-0", "gate-1", "gate-2", "gate-3"]
    assert not any("allowMultipleAllocations" in d for d in devices)
    assert not any("bindingConditions" in d for d in devices)
    unready = decisions.gate_slice("n", 1, devices=4, ready=False)["spec"]["devices"]
    assert all(d["bindingConditions"] == [domain.GATE_BINDING_CONDITION] for d in unready)


def test_gate_device_is_tainted_while_the_node_is_not_ready() -> None:
    # Devices nobody held while the node was ready: NoExecute, so a pod that a lagging scheduler allocated
    # one from the ready shape is evicted; held ones NoSchedule, their pods were placed on a ready GPU.
    held, free = decisions.gate_slice("n", 4, devices=2, ready=False, held=frozenset({"gate-0"}))["spec"]["devices"]
    assert held["taints"] == [{"key": domain.GATE_DEVICE_TAINT, "value": "true", "effect": "NoSchedule"}]
    assert free["taints"] == [{"key": domain.GATE_DEVICE_TAINT, "value": "true", "effect": "NoExecute"}]
    assert held["bindingConditions"] == free["bindingConditions"] == [domain.GATE_BINDING_CONDITION]
    assert held["bindingFailureConditions"] == [domain.GATE_FAILURE_CONDITION]
    (ready,) = decisions.gate_slice("n", 5, ready=True, held=frozenset({"gate-0"}))["spec"]["devices"]
    assert ready == {"name": "gate-0"}
