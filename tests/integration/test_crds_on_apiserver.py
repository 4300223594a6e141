"""Our CRDs on the real kube-apiserver: every one installs, each sample is accepted, bad input is rejected
with the schema's own message, and the status subresource and printer columns work."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from capi_gpu.api.kinds import BY_KIND, KINDS
from capi_gpu.kube import CRDS, Invalid, Kube, ours

pytestmark = pytest.mark.integration

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "samples"


def sample(kind: str) -> dict[str, Any]:
    for path in SAMPLES.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        if doc.get("kind") == kind:
            return dict(doc)
    raise AssertionError(f"no sample for {kind} in {SAMPLES}")


def test_every_crd_is_established_with_contract_label(kube: Kube) -> None:
    for kind in KINDS:
        crd = kube.get(CRDS, kind.crd_name)
        assert crd["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"] == "v1alpha1"
        established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert established["Established"] == "True", kind.kind
        assert established["NamesAccepted"] == "True", kind.kind


@pytest.mark.parametrize("kind", [k.kind for k in KINDS])
def test_valid_sample_is_accepted(kube: Kube, namespace: str, kind: str) -> None:
    obj = sample(kind)
    created = kube.create(ours(BY_KIND[kind].plural), obj, namespace)
    assert created["metadata"]["uid"]
    # Defaults declared in the models reach the stored object.
    if kind == "HetznerGPUMachine":
        assert created["spec"]["gpu"]["migMode"] == "Static"
        assert created["spec"]["installImage"]["swraid"] == 1


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    node = out
    *parents, leaf = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if value is _DELETE:
        node.pop(leaf)
    else:
        node[leaf] = value
    return out


_DELETE = object()

# (kind, field path, bad value, what the apiserver says). One row per class of error.
BAD_INPUT = [
    (
        "HetznerGPUHost",
        "spec.serverNumber",
        -3,
        "spec.serverNumber: Invalid value: -3: spec.serverNumber in body should be greater than or equal to 1",
    ),
    ("HetznerGPUHost", "spec.serverNumber", _DELETE, "spec.serverNumber: Required value"),
    (
        "HetznerGPUMachine",
        "spec.gpu.migMode",
        "Sometimes",
        'spec.gpu.migMode: Unsupported value: "Sometimes": supported values: "Static", "Dynamic"',
    ),
    (
        "HetznerGPUMachine",
        "spec.gpu.layout.profiles",
        {"1g.24gb": 0},
        "spec.gpu.layout.profiles.1g.24gb: Invalid value: 0: spec.gpu.layout.profiles.1g.24gb in body should be greater than or equal to 1",
    ),
    (
        "HetznerGPUMachine",
        "spec.gpu.driverBranch",
        "latest",
        'spec.gpu.driverBranch: Invalid value: "latest": spec.gpu.driverBranch in body should match',
    ),
    (
        "HetznerGPUMachineTemplate",
        "spec.standby.size",
        -1,
        "spec.standby.size: Invalid value: -1: spec.standby.size in body should be greater than or equal to 0",
    ),
    ("HetznerGPUMachineTemplate", "spec.template", _DELETE, "spec.template: Required value"),
    ("HetznerGPUCluster", "spec.robotCredentials", _DELETE, "spec.robotCredentials: Required value"),
    (
        "HetznerGPUClusterTemplate",
        "spec.template.spec.controlPlaneLoadBalancer.port",
        0,
        "spec.template.spec.controlPlaneLoadBalancer.port: Invalid value: 0",
    ),
    (
        "HetznerGPURemediation",
        "spec.strategy.onExhaustion",
        "Explode",
        'spec.strategy.onExhaustion: Unsupported value: "Explode": supported values: "Reuse", "Retire"',
    ),
    (
        "HetznerGPURemediationTemplate",
        "spec.template.spec.strategy.retryLimit",
        -1,
        "spec.template.spec.strategy.retryLimit: Invalid value: -1",
    ),
]


@pytest.mark.parametrize(("kind", "path", "value", "message"), BAD_INPUT, ids=[f"{r[0]}-{r[1]}" for r in BAD_INPUT])
def test_invalid_object_is_rejected_with_schema_message(
    kube: Kube, namespace: str, kind: str, path: str, value: Any, message: str
) -> None:
    bad = _set(sample(kind), path, value)
    with pytest.raises(Invalid) as err:
        kube.create(ours(BY_KIND[kind].plural), bad, namespace)
    assert message in err.value.message


def test_status_is_a_subresource(kube: Kube, namespace: str) -> None:
    host = kube.create(ours("hetznergpuhosts"), sample("HetznerGPUHost"), namespace)
    name = host["metadata"]["name"]
    # A spec write cannot set status...
    kube.patch(ours("hetznergpuhosts"), name, {"status": {"state": "Available"}}, namespace)
    assert kube.get(ours("hetznergpuhosts"), name, namespace).get("status", {}).get("state") is None
    # ...the status subresource can, and is validated.
    kube.patch(ours("hetznergpuhosts"), name, {"status": {"state": "Available"}}, namespace, sub="status")
    assert kube.get(ours("hetznergpuhosts"), name, namespace)["status"]["state"] == "Available"
    with pytest.raises(Invalid, match=r"status\.state: Unsupported value"):
        kube.patch(ours("hetznergpuhosts"), name, {"status": {"state": "Happy"}}, namespace, sub="status")
