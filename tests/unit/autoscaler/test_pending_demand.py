"""Pending demand: which pods count (Unschedulable, the grace, bound, gated, running, deleted), claims from the
shipped templates (exact profile, firstAvailable in order, the gate skipped), generated vs not-yet-generated
claims, allocated and shared claims, whole-GPU requests, counts, and what is not ours (unknown CEL, other
drivers, other attributes, any-MIG, allocationMode All, missing classes or templates), per pod."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from capi_gpu.autoscaler import demand, selectors
from capi_gpu.autoscaler.selectors import Kind, NotOurs, Want
from capi_gpu.gpu.packing import WHOLE_GPU, Request

REPO = Path(__file__).resolve().parents[3]
NOW = datetime.datetime(2026, 12, 2, 10, 0, 0, tzinfo=datetime.UTC)
CREATED = "2026-12-02T09:59:50Z"  # 10 s before NOW: inside the default grace


def _docs(path: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO / path).read_text()) if d]


SHIPPED = {d["metadata"]["name"]: d for d in _docs("config/dra/claims/mig-profiles.yaml")} | {
    d["metadata"]["name"]: d for d in _docs("config/dra/claims/prioritized.yaml")
}
GATE_CLASS = _docs("config/dra/gate-deviceclass.yaml")[0]


def nvidia_class(name: str, kind: str) -> dict[str, Any]:
    """NVIDIA's chart DeviceClasses (single-quoted CEL, as the chart renders it)."""
    cel = f"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{kind}'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": cel}}]},
    }


CLASSES = {
    "mig.nvidia.com": nvidia_class("mig.nvidia.com", "mig"),
    "gpu.nvidia.com": nvidia_class("gpu.nvidia.com", "gpu"),
    GATE_CLASS["metadata"]["name"]: GATE_CLASS,
    "nic.example.com": {
        "metadata": {"name": "nic.example.com"},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "nic.example.com"'}}]},
    },
}


def templates(ns: str = "team-a") -> dict[demand.Key, dict[str, Any]]:
    out = {}
    for name, doc in SHIPPED.items():
        d = copy.deepcopy(doc)
        d["metadata"].update(namespace=ns, uid=f"uid-{name}", resourceVersion="100")
        out[(ns, name)] = d
    return out


def pod(
    name: str,
    claims: list[dict[str, Any]],
    *,
    scheduled: str | None = "Unschedulable",
    created: str = CREATED,
    generated: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A pod as the apiserver returns it while kube-scheduler cannot place it."""
    conditions = []
    if scheduled:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": scheduled,
                "message": "0/0 nodes are available: no nodes available to schedule pods.",
                "lastProbeTime": None,
                "lastTransitionTime": created,
            }
        )
    status: dict[str, Any] = {"phase": "Pending", "conditions": conditions, "qosClass": "BestEffort"}
    if generated is not None:
        status["resourceClaimStatuses"] = [{"name": k, "resourceClaimName": v} for k, v in generated.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "creationTimestamp": created},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": c["name"]} for c in claims]},
                }
            ],
            "resourceClaims": claims,
            "schedulerName": "default-scheduler",
            **spec,
        },
        "status": status,
    }


def generated_claim(pod_name: str, ref: str, template: str, *, allocated: bool = False) -> dict[str, Any]:
    """The claim the resourceclaim controller makes from a template for one pod."""
    name = f"{pod_name}-{ref}-x7k2p"
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "generateName": f"{pod_name}-{ref}-",
            "annotations": {"resource.kubernetes.io/pod-claim-name": ref},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": f"uid-{pod_name}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": copy.deepcopy(SHIPPED[template]["spec"]["spec"]),
        "status": {},
    }
    if allocated:
        claim["status"]["allocation"] = {
            "devices": {
                "results": [
                    {"request": "mig", "driver": "gpu.nvidia.com", "pool": "gex-1", "device": "gpu-0-mig-2g48gb-5-0"},
                ]
            }
        }
    return claim


def from_template(ref: str, template: str) -> dict[str, Any]:
    return {"name": ref, "resourceClaimTemplateName": template}


def run(pods: list[dict[str, Any]], claims: Sequence[dict[str, Any]] = (), **kw: Any) -> demand.Demand:
    return demand.pending_demand(pods, demand.index(claims), templates(), CLASSES, NOW, **kw)


def test_shipped_2g_template_before_its_claim_exists() -> None:
    got = run([pod("p", [from_template("gpu", "mig-2g-48gb")])])
    assert got.requests == (Request.exact("2g.48gb"),)
    assert got.pods == ("team-a/p",)
    assert got.summary() == "1x 2g.48gb"


def test_generated_claim_is_read_once_it_exists() -> None:
    claim = generated_claim("p", "gpu", "mig-1g-24gb-gfx")
    p = pod("p", [from_template("gpu", "mig-2g-48gb")], generated={"gpu": claim["metadata"]["name"]})
    assert run([p], [claim]).requests == (Request.exact("1g.24gb+gfx"),)  # the claim, not the template


def test_first_available_keeps_the_order() -> None:
    got = run([pod("p", [from_template("gpu", "mig-2g-48gb-or-1g-24gb")])])
    assert got.requests == (Request.first_available("2g.48gb", "1g.24gb"),)


@pytest.mark.parametrize("template", sorted(n for n in SHIPPED if n != "mig-2g-48gb-or-1g-24gb"))
def test_every_shipped_template_reads_as_its_annotated_profile(template: str) -> None:
    profile = SHIPPED[template]["metadata"]["annotations"]["gpu.infrastructure.cluster.x-k8s.io/mig-profile"]
    assert run([pod("p", [from_template("gpu", template)])]).requests == (Request.exact(profile),)


def test_same_demand_merges_across_pods() -> None:
    pods = [pod(f"p{i}", [from_template("gpu", "mig-2g-48gb")]) for i in range(3)]
    assert run(pods).requests == (Request.exact("2g.48gb", 3),)


def test_allocated_claim_is_served_and_a_shared_claim_counts_once() -> None:
    done = generated_claim("a", "gpu", "mig-2g-48gb", allocated=True)
    shared = generated_claim("s", "gpu", "mig-1g-24gb")
    shared["metadata"].update(name="shared", ownerReferences=[])
    pods = [
        pod("a", [from_template("gpu", "mig-2g-48gb")], generated={"gpu": done["metadata"]["name"]}),
        pod("b", [{"name": "gpu", "resourceClaimName": "shared"}]),
        pod("c", [{"name": "gpu", "resourceClaimName": "shared"}]),
    ]
    got = run(pods, [done, shared])
    assert got.requests == (Request.exact("1g.24gb"),)
    assert got.pods == ("team-a/b",)


def test_whole_gpu_claim() -> None:
    claim = {
        "metadata": {"name": "whole", "namespace": "team-a"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2},
                    },
                ]
            }
        },
    }
    got = run([pod("p", [{"name": "gpu", "resourceClaimName": "whole"}])], [claim])
    assert got.requests == (Request((WHOLE_GPU,), 2),)


@pytest.mark.parametrize(
    ("name", "make", "counts"),
    [
        ("unschedulable", lambda: pod("p", [from_template("g", "mig-2g-48gb")]), True),
        (
            "no verdict yet, inside the grace",
            lambda: pod("p", [from_template("g", "mig-2g-48gb")], scheduled=None),
            False,
        ),
        (
            "no verdict, past the grace",
            lambda: pod("p", [from_template("g", "mig-2g-48gb")], scheduled=None, created="2026-12-02T09:58:00Z"),
            True,
        ),
        ("bound", lambda: pod("p", [from_template("g", "mig-2g-48gb")], nodeName="gex-1"), False),
        (
            "scheduling gates",
            lambda: pod("p", [from_template("g", "mig-2g-48gb")], schedulingGates=[{"name": "example.com/quota"}]),
            False,
        ),
        (
            "scheduler said something else",
            lambda: pod("p", [from_template("g", "mig-2g-48gb")], scheduled="SchedulingGated"),
            False,
        ),
    ],
)
def test_which_pods_count(name: str, make: Any, counts: bool) -> None:
    assert bool(run([make()]).requests) is counts, name


def test_deleted_or_running_pods_do_not_count() -> None:
    deleting = pod("p", [from_template("g", "mig-2g-48gb")])
    deleting["metadata"]["deletionTimestamp"] = "2026-12-02T09:59:59Z"
    running = pod("q", [from_template("g", "mig-2g-48gb")])
    running["status"]["phase"] = "Running"
    assert run([deleting, running]).requests == ()


def test_pods_without_claims_are_not_gpu_demand_and_not_ignored() -> None:
    got = run([pod("cpu-only", [])])
    assert (got.requests, got.ignored) == ((), ())


def claim_with(*requests: dict[str, Any], name: str = "c") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team-a"}, "spec": {"devices": {"requests": list(requests)}}}


def mig(cel: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "mig",
        "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {"expression": cel}}], **extra},
    }


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (mig('device.attributes["gpu.nvidia.com"].profile.startsWith("2g")'), "not a form the scaler reads"),
        (mig('device.attributes["gpu.nvidia.com"].productName == "NVIDIA RTX PRO 6000"'), "productName"),
        (mig('device.driver == "gpu.nvidia.com"'), "without a profile selector"),
        (mig('device.attributes["gpu.nvidia.com"].profile == "2g.48gb"', allocationMode="All"), "allocationMode All"),
        ({"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}, "another driver"),
        ({"name": "x", "exactly": {"deviceClassName": "missing.example.com"}}, "not found"),
        (
            {
                "name": "x",
                "firstAvailable": [
                    {
                        "name": "a",
                        "deviceClassName": "mig.nvidia.com",
                        "selectors": [
                            {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].profile == "2g.48gb"'}}
                        ],
                    },
                    {
                        "name": "b",
                        "deviceClassName": "mig.nvidia.com",
                        "count": 2,
                        "selectors": [
                            {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].profile == "1g.24gb"'}}
                        ],
                    },
                ],
            },
            "different counts",
        ),
    ],
)
def test_what_is_not_ours_ignores_the_whole_pod_with_the_reason(request_: dict[str, Any], reason: str) -> None:
    mig_ok = mig('device.attributes["gpu.nvidia.com"].profile == "2g.48gb"')
    mig_ok["name"] = "ok"
    got = run([pod("p", [{"name": "g", "resourceClaimName": "c"}])], [claim_with(mig_ok, request_)])
    assert got.requests == ()
    assert len(got.ignored) == 1 and got.ignored[0].pod == "team-a/p"
    assert reason in got.ignored[0].reason


def test_missing_claim_template_is_reported() -> None:
    got = run([pod("p", [from_template("g", "no-such-template")])])
    assert got.requests == () and "no-such-template" in got.ignored[0].reason


@pytest.mark.parametrize(
    ("cls", "cel", "want"),
    [
        ("mig.nvidia.com", 'device.attributes["gpu.nvidia.com"].profile == "2g.48gb"', Want(Kind.MIG, "2g.48gb")),
        (
            "mig.nvidia.com",
            "(device.attributes['gpu.nvidia.com'].profile == '1g.24gb+me')",
            Want(Kind.MIG, "1g.24gb+me"),
        ),
        ("gpu.nvidia.com", None, Want(Kind.WHOLE_GPU)),
        ("gate.gpu.infrastructure.cluster.x-k8s.io", None, Want(Kind.GATE)),
    ],
)
def test_selector_forms_read(cls: str, cel: str | None, want: Want) -> None:
    sels = [{"cel": {"expression": cel}}] if cel else []
    assert selectors.resolve(cls, sels, CLASSES) == want


def test_contradicting_class_and_request_are_not_ours() -> None:
    with pytest.raises(NotOurs, match="disagree"):
        selectors.resolve(
            "gpu.nvidia.com", [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].type == "mig"'}}], CLASSES
        )
