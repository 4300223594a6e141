"""The readiness gate on the real kube-apiserver (1.36): shipped DRA manifests are accepted, the gate
ResourceSlice validates, node patches apply in order with their taint precondition, and the claim gate's
status.devices entries are accepted for our driver and refused for NVIDIA's under the shipped RBAC."""

from __future__ import annotations

import datetime
import importlib.util
import json
import pathlib
import subprocess
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import yaml

from capi_gpu import domain
from capi_gpu.api.conditions import PoolReason
from capi_gpu.readiness import decisions
from capi_gpu_sim import binaries, controlplane

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
WRITER = "readiness-writer"  # impersonated user bound to config/rbac/readiness_role.yaml
EXPECTED = decisions.ExpectedPool(profiles={"1g.24gb": 2, "2g.48gb": 1})


def _fixtures() -> ModuleType:
    """The NVIDIA-format slice builders the unit tests use (tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location("nvidia_slices", ROOT / "tests/unit/readiness/nvidia_slices.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


nv = _fixtures()


class Kubectl:
    def __init__(self, binary: pathlib.Path, kubeconfig: pathlib.Path) -> None:
        self.base = [str(binary), "--kubeconfig", str(kubeconfig)]

    def run(self, *args: str, body: Any = None, as_writer: bool = False) -> subprocess.CompletedProcess[str]:
        argv = [*self.base, *([f"--as={WRITER}"] if as_writer else []), *args]
        stdin = None if body is None else json.dumps(body)
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60, check=False)

    def ok(self, *args: str, body: Any = None, as_writer: bool = False) -> str:
        run = self.run(*args, body=body, as_writer=as_writer)
        assert run.returncode == 0, f"kubectl {' '.join(args)}: {run.stderr}"
        return run.stdout

    def get(self, *args: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.ok("get", *args, "-o", "json"))
        return result

    def write_node(self, name: str, write: decisions.NodeWrite) -> subprocess.CompletedProcess[str]:
        kind = "strategic" if write.content_type == decisions.node.STRATEGIC_MERGE_PATCH else "json"
        sub = ["--subresource=status"] if write.subresource is decisions.NodeSubresource.STATUS else []
        return self.run("patch", "node", name, *sub, f"--type={kind}", "-p", json.dumps(write.body), as_writer=True)


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    options = controlplane.Options(
        with_scheduler=False, with_controller_manager=False, with_capi=False, install_our_crds=False
    )
    with controlplane.ControlPlane(tmp_path_factory.mktemp("cp"), options) as cp:
        k = Kubectl(binaries.locate().kubectl, cp.kubeconfig)
        k.ok("apply", "-f", str(ROOT / "config/rbac/readiness_role.yaml"))
        k.ok(
            "create",
            "clusterrolebinding",
            "readiness",
            "--clusterrole=capi-gpu-readiness",
            f"--user={WRITER}",
        )
        k.ok("create", "namespace", "team-a")
        yield k


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def create_node(k: Kubectl, name: str) -> dict[str, Any]:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {domain.LABEL_GPU_PRESENT: "true"}},
        "spec": {"taints": [{"key": domain.NODE_STARTUP_TAINT, "effect": "NoSchedule"}]},
    }
    k.ok("create", "-f", "-", body=node)
    return k.get("node", name)


def apply_patch(k: Kubectl, name: str, patch: decisions.NodePatch) -> None:
    for write in patch.ordered():
        run = k.write_node(name, write)
        assert run.returncode == 0, run.stderr


def test_shipped_manifests_are_accepted(kubectl: Kubectl) -> None:
    kubectl.ok("apply", "-f", str(ROOT / "config/dra/gate-deviceclass.yaml"))
    kubectl.ok("apply", "--dry-run=server", "-f", str(ROOT / "config/dra/gate-plugin-daemonset.yaml"))
    kubectl.ok("apply", "-n", "team-a", "-f", str(ROOT / "config/dra/claims/mig-profiles.yaml"))
    kubectl.ok("apply", "-n", "team-a", "-f", str(ROOT / "config/dra/claims/prioritized.yaml"))
    for name in ("devicetaintrule.yaml", "resourceclaimtemplate.yaml"):
        kubectl.ok("apply", "-f", str(ROOT / "config/dra/examples/tenant-reservation" / name))
    templates = kubectl.get("resourceclaimtemplates", "-n", "team-a")["items"]
    assert len(templates) == 13


def test_node_gate_cycle(kubectl: Kubectl) -> None:
    node = create_node(kubectl, "gex131-n")
    kubectl.ok("create", "-f", "-", body=nv.nvidia_slice("gex131-n", nv.layout_devices(nv.BALANCED)))
    slices = kubectl.get("resourceslices")["items"]
    ready = decisions.pool_verdict(slices, "gex131-n", EXPECTED)
    assert ready.ready, ready.message

    apply_patch(kubectl, "gex131-n", decisions.node_gate_patch(node, ready, now()))
    node = kubectl.get("node", "gex131-n")
    assert domain.NODE_STARTUP_TAINT not in {t["key"] for t in node["spec"].get("taints", [])}
    (condition,) = [c for c in node["status"]["conditions"] if c["type"] == domain.GPU_READY_CONDITION]
    assert (condition["status"], condition["reason"]) == ("True", "Ready")
    assert decisions.node_gate_patch(node, ready, now()).empty

    # A taint change computed from an old read is refused, not applied over someone else's write.
    gone = decisions.PoolVerdict("gex131-n", PoolReason.NO_SLICES, "no slices")
    stale = decisions.node_gate_patch(node, gone, now())
    kubectl.ok("taint", "node", "gex131-n", "example.com/cordon=1:NoSchedule")
    (taint_write,) = [w for w in stale.ordered() if w.subresource is decisions.NodeSubresource.NODE]
    assert kubectl.write_node("gex131-n", taint_write).returncode != 0

    node = kubectl.get("node", "gex131-n")
    apply_patch(kubectl, "gex131-n", decisions.node_gate_patch(node, gone, now()))
    node = kubectl.get("node", "gex131-n")
    keys = [t["key"] for t in node["spec"]["taints"]]
    assert domain.NODE_STARTUP_TAINT in keys and "example.com/cordon" in keys
    (condition,) = [c for c in node["status"]["conditions"] if c["type"] == domain.GPU_READY_CONDITION]
    assert (condition["status"], condition["reason"]) == ("False", "NoSlices")


def test_gate_slice_and_claim_status(kubectl: Kubectl) -> None:
    node = create_node(kubectl, "gex131-c")
    kubectl.ok("create", "-f", "-", body=nv.nvidia_slice("gex131-c", nv.layout_devices(nv.BALANCED)))
    gate = decisions.gate_slice("gex131-c", 1, node_uid=node["metadata"]["uid"])
    kubectl.ok("create", "-f", "-", body=gate, as_writer=True)
    stored = kubectl.get("resourceslice", gate["metadata"]["name"])
    assert stored["spec"]["devices"] == gate["spec"]["devices"]

    template = next(d for d in yaml.safe_load_all((ROOT / "config/dra/claims/mig-profiles.yaml").read_text()) if d)
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "trainer", "namespace": "team-a"},
        "spec": template["spec"]["spec"],
    }
    kubectl.ok("create", "-f", "-", body=claim)
    claim = kubectl.get("resourceclaim", "-n", "team-a", "trainer")
    # What kube-scheduler writes in PreBind (we play the scheduler: admin may write the allocation).
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "mig",
                        "driver": "gpu.nvidia.com",
                        "pool": "gex131-c",
                        "device": nv.mig_name("1g.24gb", 6),
                    },
                    {
                        "request": "gate",
                        "driver": domain.GATE_DRIVER,
                        "pool": "gex131-c",
                        "device": f"{domain.GATE_DEVICE_NAME}-0",
                        "bindingConditions": [domain.GATE_BINDING_CONDITION],
                        "bindingFailureConditions": [domain.GATE_FAILURE_CONDITION],
                    },
                ]
            },
            "allocationTimestamp": decisions.node.rfc3339(now()),
        }
    }
    kubectl.ok("replace", "--subresource=status", "-f", "-", body=claim)
    claim = kubectl.get("resourceclaim", "-n", "team-a", "trainer")

    slices = kubectl.get("resourceslices")["items"]
    verdicts = {"gex131-c": decisions.pool_verdict(slices, "gex131-c", EXPECTED)}
    decision = decisions.claim_gate_decision(claim, verdicts, decisions.current_pools(slices, "gex131-c"), now())
    assert decision.outcome is decisions.GateOutcome.BIND, decision.message
    claim["status"]["devices"] = decisions.merged_device_statuses(claim, decision.entries)
    kubectl.ok("replace", "--subresource=status", "-f", "-", body=claim, as_writer=True)

    claim = kubectl.get("resourceclaim", "-n", "team-a", "trainer")
    (entry,) = claim["status"]["devices"]
    assert decisions.device_status_key(entry) == decisions.device_status_key(decision.entries[0])
    bound = {c["type"]: c["status"] for c in entry["conditions"]}
    assert bound == {domain.GATE_BINDING_CONDITION: "True", domain.GATE_FAILURE_CONDITION: "False"}
    assert decisions.claim_gate_decision(claim, verdicts, {}, now()).outcome is decisions.GateOutcome.SETTLED

    # The role is scoped to our driver: NVIDIA's device status is not ours to write.
    claim["status"]["devices"].append(
        {
            "driver": "gpu.nvidia.com",
            "pool": "gex131-c",
            "device": nv.mig_name("1g.24gb", 6),
            "conditions": [],
        }
    )
    refused = kubectl.run("replace", "--subresource=status", "-f", "-", body=claim, as_writer=True)
    assert refused.returncode != 0
    assert "resourceclaims/driver" in refused.stderr


def test_unready_gate_slice_with_device_taint_validates(kubectl: Kubectl) -> None:
    node = create_node(kubectl, "gex131-t")
    uid = node["metadata"]["uid"]
    gate = decisions.gate_slice("gex131-t", 2, devices=2, ready=False, node_uid=uid, held=frozenset({"gate-0"}))
    kubectl.ok("create", "-f", "-", body=gate, as_writer=True)
    held, free = kubectl.get("resourceslice", gate["metadata"]["name"])["spec"]["devices"]
    for device, effect in ((held, "NoSchedule"), (free, "NoExecute")):
        (taint,) = device["taints"]
        assert (taint["key"], taint["effect"]) == (domain.GATE_DEVICE_TAINT, effect)
        assert "timeAdded" in taint  # set by the apiserver
