"""The real kube-scheduler honours DRA binding conditions: a device with bindingConditions holds the pod
in PreBind (Event BindingConditionsPending) until someone writes the condition True on the claim.
This proves the harness, before any of our controllers is involved."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from capi_gpu.kube import DEVICECLASSES, EVENTS, NODES, PODS, RESOURCECLAIMS, RESOURCESLICES, Kube

pytestmark = pytest.mark.integration

DRIVER = "gate.test.example.com"
COND = "test.example.com/ready"


def wait_for(what: str, fn: Any, timeout: float = 60.0, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def plain_node(kube: Kube, name: str) -> None:
    kube.create(
        NODES,
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}},
    )
    kube.patch(
        NODES,
        name,
        {
            "status": {
                "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "sim",
                        "lastHeartbeatTime": "2026-12-02T00:00:00Z",
                        "lastTransitionTime": "2026-12-02T00:00:00Z",
                    }
                ],
            }
        },
        sub="status",
    )


def test_pod_waits_for_binding_condition_then_binds(kube: Kube, namespace: str) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    plain_node(kube, node)
    cls = f"gate-{uuid.uuid4().hex[:6]}"
    kube.create(
        DEVICECLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": cls},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
    )
    kube.create(
        RESOURCESLICES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gate"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": "gate",
                        "bindingConditions": [COND],
                        "bindingFailureConditions": ["test.example.com/failed"],
                    }
                ],
            },
        },
    )
    kube.create(
        RESOURCECLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": cls}}]}},
        },
        namespace,
    )
    kube.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "g"}]}}
                ],
                "resourceClaims": [{"name": "g", "resourceClaimName": "c"}],
            },
        },
        namespace,
    )

    def pending_event() -> bool:
        return any(
            e.get("reason") == "BindingConditionsPending" and e["involvedObject"]["name"] == "p"
            for e in kube.list(EVENTS, namespace)
        )

    wait_for("BindingConditionsPending", pending_event)
    claim = kube.get(RESOURCECLAIMS, "c", namespace)
    result = claim["status"]["allocation"]["devices"]["results"][0]
    assert result["bindingConditions"] == [COND]
    assert not kube.get(PODS, "p", namespace)["spec"].get("nodeName"), "bound before the condition was written"

    kube.patch(
        RESOURCECLAIMS,
        "c",
        {
            "status": {
                "devices": [
                    {
                        "driver": DRIVER,
                        "pool": result["pool"],
                        "device": result["device"],
                        "conditions": [
                            {
                                "type": COND,
                                "status": "True",
                                "reason": "Ready",
                                "message": "test",
                                "lastTransitionTime": "2026-12-02T00:00:00Z",
                            }
                        ],
                    }
                ]
            }
        },
        namespace,
        sub="status",
    )
    bound = wait_for("the pod to bind", lambda: kube.get(PODS, "p", namespace)["spec"].get("nodeName"), timeout=30)
    assert bound == node
