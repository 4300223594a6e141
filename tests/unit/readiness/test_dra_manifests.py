"""Shipped DRA and readiness manifests agree with domain.py, plugin paths, dra-nvidia.md; kustomize builds."""

from __future__ import annotations

import pathlib
import re
import subprocess
from typing import Any

import nvidia_slices as nv
import pytest
import yaml

from capi_gpu import domain
from capi_gpu.readiness import kubeletplugin
from capi_gpu_sim import binaries

ROOT = pathlib.Path(__file__).resolve().parents[3]
CONFIG = ROOT / "config"
PROFILES = [
    "1g.24gb",
    "1g.24gb+gfx",
    "1g.24gb-me",
    "1g.24gb+me",
    "1g.24gb+me.all",
    "2g.48gb",
    "2g.48gb+gfx",
    "2g.48gb-me",
    "2g.48gb+me.all",
    "4g.96gb",
    "4g.96gb+gfx",
]
PROFILE_CEL = re.compile(r'^device\.attributes\["gpu\.nvidia\.com"\]\.profile == "(?P<profile>[^"]+)"$')
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def load(relative: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((CONFIG / relative).read_text()) if d]


def only(relative: str) -> dict[str, Any]:
    (doc,) = load(relative)
    return doc


def requests(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in template["spec"]["spec"]["devices"]["requests"]}


def profile_of(selector: dict[str, Any]) -> str:
    match = PROFILE_CEL.match(selector["cel"]["expression"])
    assert match, selector
    return match["profile"]


def assert_gate_request(template: dict[str, Any]) -> None:
    gate = requests(template)["gate"]["exactly"]
    assert gate == {"deviceClassName": domain.GATE_DEVICE_CLASS, "allocationMode": "ExactCount", "count": 1}
    # Co-location comes from node-local slices; a matchAttribute would need a node-valued attribute
    # that NVIDIA devices do not publish, and would make every claim unsatisfiable.
    assert "constraints" not in template["spec"]["spec"]["devices"]


def test_gate_device_class_selects_the_gate_driver() -> None:
    cls = only("dra/gate-deviceclass.yaml")
    assert (cls["apiVersion"], cls["kind"], cls["metadata"]["name"]) == (
        "resource.k8s.io/v1",
        "DeviceClass",
        domain.GATE_DEVICE_CLASS,
    )
    (selector,) = cls["spec"]["selectors"]
    assert selector["cel"]["expression"] == f'device.driver == "{domain.GATE_DRIVER}"'


def test_one_template_per_rtx_pro_6000_profile() -> None:
    templates = load("dra/claims/mig-profiles.yaml")
    by_profile = {t["metadata"]["annotations"][domain.ANNOTATION_MIG_PROFILE]: t for t in templates}
    assert sorted(by_profile) == sorted(PROFILES)
    assert len({t["metadata"]["name"] for t in templates}) == len(PROFILES)
    for profile, template in by_profile.items():
        assert (template["apiVersion"], template["kind"]) == ("resource.k8s.io/v1", "ResourceClaimTemplate")
        assert DNS_LABEL.match(template["metadata"]["name"])
        mig = requests(template)["mig"]["exactly"]
        assert mig["deviceClassName"] == "mig.nvidia.com"
        assert (mig["allocationMode"], mig["count"]) == ("ExactCount", 1)
        (selector,) = mig["selectors"]
        assert profile_of(selector) == profile
        assert_gate_request(template)


def test_profiles_are_the_catalogs() -> None:
    from capi_gpu.gpu import catalog

    model = catalog.builtin_catalog()["rtx-pro-6000"]
    assert sorted(p.name for p in model.profiles) == sorted(PROFILES)
    assert sorted(nv.RTX_PRO_6000) == sorted(PROFILES)


def test_prioritized_list_prefers_two_slices() -> None:
    template = only("dra/claims/prioritized.yaml")
    mig = requests(template)["mig"]
    assert "exactly" not in mig
    subs = mig["firstAvailable"]
    assert [profile_of(s["selectors"][0]) for s in subs] == ["2g.48gb", "1g.24gb"]
    assert all(s["deviceClassName"] == "mig.nvidia.com" and DNS_LABEL.match(s["name"]) for s in subs)
    assert_gate_request(template)


def test_tenant_reservation_is_tolerated_by_the_tenant_only() -> None:
    rule = only("dra/examples/tenant-reservation/devicetaintrule.yaml")
    assert (rule["apiVersion"], rule["kind"]) == ("resource.k8s.io/v1beta2", "DeviceTaintRule")
    assert rule["spec"]["deviceSelector"]["driver"] == domain.NVIDIA_DRIVER
    assert set(rule["spec"]["deviceSelector"]) <= {"driver", "pool", "device"}  # no CEL since 1.35
    taint = rule["spec"]["taint"]
    assert taint["key"] == domain.DEVICE_TAINT_RESERVED
    assert taint["effect"] == "NoSchedule"
    template = only("dra/examples/tenant-reservation/resourceclaimtemplate.yaml")
    (toleration,) = requests(template)["mig"]["exactly"]["tolerations"]
    assert toleration == {
        "key": taint["key"],
        "operator": "Equal",
        "value": taint["value"],
        "effect": "NoSchedule",
    }
    assert_gate_request(template)
    # The shipped, untenanted templates do not tolerate it.
    for shipped in load("dra/claims/mig-profiles.yaml"):
        assert "tolerations" not in requests(shipped)["mig"]["exactly"]


def test_gate_plugin_daemonset() -> None:
    ds = only("dra/gate-plugin-daemonset.yaml")
    assert (ds["apiVersion"], ds["kind"]) == ("apps/v1", "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {domain.LABEL_GPU_PRESENT: "true"}
    assert {"key": domain.NODE_STARTUP_TAINT, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/capi-gpu/capi-gpu:dev"
    assert container["command"] == ["capi-gpu", "gate-plugin", "serve"]
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == ["capi-gpu", "gate-plugin", "probe"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert all(host == inside for inside, host in mounts.items()), "host paths must be mounted 1:1"
    paths = kubeletplugin.PluginPaths()
    for socket in (paths.registration_socket, paths.dra_socket):
        assert any(socket.is_relative_to(m) for m in mounts), f"{socket} is not on a hostPath mount"


def test_node_readiness_rule_reads_our_condition_and_owns_our_taint() -> None:
    rule = only("readiness/node-readiness-rule.yaml")
    assert (rule["apiVersion"], rule["kind"]) == ("readiness.node.x-k8s.io/v1alpha1", "NodeReadinessRule")
    assert "namespace" not in rule["metadata"]  # cluster-scoped
    spec = rule["spec"]
    assert spec["conditions"] == [{"type": domain.GPU_READY_CONDITION, "requiredStatus": "True"}]
    assert spec["taint"] == {"key": domain.NODE_STARTUP_TAINT, "effect": "NoSchedule"}
    assert spec["taint"]["key"].startswith("readiness.k8s.io/")
    assert spec["enforcementMode"] == "continuous"
    assert spec["nodeSelector"] == {"matchLabels": {domain.LABEL_GPU_PRESENT: "true"}}


def test_readiness_role() -> None:
    role = only("rbac/readiness_role.yaml")
    rules = {(r["apiGroups"][0], r["resources"][0]): r for r in role["rules"]}
    assert set(rules[("resource.k8s.io", "resourceclaims")]["verbs"]) == {"get", "list", "watch"}
    assert {"patch", "update"} <= set(rules[("resource.k8s.io", "resourceclaims/status")]["verbs"])
    driver = rules[("resource.k8s.io", "resourceclaims/driver")]
    assert driver["resourceNames"] == [domain.GATE_DRIVER]
    assert set(driver["verbs"]) == {"arbitrary-node:patch", "arbitrary-node:update"}
    slices = set(rules[("resource.k8s.io", "resourceslices")]["verbs"])
    assert slices == {"create", "update", "patch", "delete", "get", "list", "watch"}
    assert set(rules[("", "nodes")]["verbs"]) == {"get", "list", "watch", "patch"}
    assert set(rules[("", "nodes/status")]["verbs"]) == {"get", "patch"}


@pytest.fixture(scope="module")
def kustomize() -> pathlib.Path:
    path = binaries.locate().kustomize
    if not path.exists():
        subprocess.run(["bash", str(binaries.BUILD_SCRIPT), "kustomize"], check=True, timeout=900)
    return path


@pytest.mark.parametrize(
    ("directory", "kinds"),
    [
        ("dra", {"DeviceClass": 1, "DaemonSet": 1}),
        ("dra/claims", {"ResourceClaimTemplate": len(PROFILES) + 1}),
        ("dra/examples/tenant-reservation", {"DeviceTaintRule": 1, "ResourceClaimTemplate": 1}),
        ("readiness", {"NodeReadinessRule": 1}),
    ],
)
def test_kustomize_builds(kustomize: pathlib.Path, directory: str, kinds: dict[str, int]) -> None:
    run = subprocess.run(
        [str(kustomize), "build", str(CONFIG / directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    built: dict[str, int] = {}
    for doc in yaml.safe_load_all(run.stdout):
        built[doc["kind"]] = built.get(doc["kind"], 0) + 1
    assert built == kinds
