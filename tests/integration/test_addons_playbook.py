"""The add-ons playbook (playbooks/addons.yml) through ansible-runner, kubernetes.core and the pinned helm, on
a real kube-apiserver: the real dra-driver-nvidia-gpu 0.4.1 chart lands (its DeviceClasses, RBAC, kubelet-plugin
DaemonSet with NVMLDeviceHealthCheck on, ResourceSlice admission policy) with our gate driver and the shipped
claim templates; a second run changes nothing; changed values upgrade the release; a chart that can't be
fetched and values the chart refuses each give their own failure class, without the kubeconfig's token."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from capi_gpu import domain
from capi_gpu.kube import DEVICECLASSES, RESOURCECLAIMTEMPLATES, Kube, NotFound, Res
from capi_gpu.provisioning import addons
from capi_gpu_sim import binaries, dra_publisher, nvidia_chart
from capi_gpu_sim.controlplane import ControlPlane, Options

pytestmark = pytest.mark.integration

CHART = binaries.REPO.parent / "shared" / "upstream" / "dra-driver-nvidia-gpu-0.4.1.tgz"
DAEMONSETS = Res("apps", "v1", "daemonsets")
POLICIES = Res("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", namespaced=False)
CLUSTERROLES = Res("rbac.authorization.k8s.io", "v1", "clusterroles", namespaced=False)
NS = "nvidia-dra-driver-gpu"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """An apiserver of its own: the chart owns cluster-wide DeviceClasses that other tests' worlds create by hand."""
    opts = Options(with_scheduler=False, with_controller_manager=False, with_capi=False, install_our_crds=False)
    with ControlPlane(tmp_path_factory.mktemp("addons-cp"), opts) as cp:
        yield cp


@pytest.fixture(scope="module")
def installer(tmp_path_factory: pytest.TempPathFactory) -> addons.AnsibleAddons:
    return addons.AnsibleAddons(tmp_path_factory.mktemp("addons-runs"), helm_binary=str(binaries.ensure_helm()))


def request(**kw: object) -> addons.AddonsRequest:
    base: dict[str, object] = {"chart_ref": str(CHART), "claim_namespaces": ("team-a",)}
    return addons.AddonsRequest(**(base | kw))  # type: ignore[arg-type]


def helm(cp: ControlPlane, *args: str) -> str:
    out = subprocess.run(
        [str(binaries.ensure_helm()), "--kubeconfig", str(cp.kubeconfig), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def test_the_real_chart_and_our_gate_land_and_a_second_run_changes_nothing(
    cluster: ControlPlane, installer: addons.AnsibleAddons
) -> None:
    assert CHART.exists(), f"the chart archive is missing: {CHART}"
    kubeconfig = cluster.kubeconfig.read_text()
    first = addons.classify(installer.run_blocking("c1", kubeconfig, request()))
    assert first.ok, first.message
    assert first.changed > 0
    kube: Kube = cluster.kube()
    classes = {c["metadata"]["name"] for c in kube.list(DEVICECLASSES)}
    assert {"gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com", domain.GATE_DEVICE_CLASS} <= classes
    ds = kube.get(DAEMONSETS, "dra-driver-nvidia-gpu-kubelet-plugin", NS)
    env = {e["name"]: e.get("value") for c in ds["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])}
    assert "NVMLDeviceHealthCheck=true" in env["FEATURE_GATES"]
    assert "DynamicMIG=false" in env["FEATURE_GATES"]
    tolerated = {t["key"] for t in ds["spec"]["template"]["spec"]["tolerations"]}
    assert domain.NODE_STARTUP_TAINT in tolerated
    assert any(p["metadata"]["name"].startswith("resourceslices-policy") for p in kube.list(POLICIES))
    assert any("kubeletplugin" in r["metadata"]["name"] for r in kube.list(CLUSTERROLES))
    kube.get(DAEMONSETS, "capi-gpu-gate-plugin", "kube-system")
    templates = {t["metadata"]["name"] for t in kube.list(RESOURCECLAIMTEMPLATES, "team-a")}
    assert {"mig-1g-24gb", "mig-2g-48gb-or-1g-24gb"} <= templates

    second = addons.classify(installer.run_blocking("c1", kubeconfig, request()))
    assert second.ok, second.message
    assert second.changed == 0
    release = json.loads(helm(cluster, "list", "-n", NS, "-o", "json"))
    assert [(r["name"], r["chart"], r["revision"]) for r in release] == [
        ("nvidia-dra-driver-gpu", "dra-driver-nvidia-gpu-0.4.1", "1")
    ]


def test_changed_values_upgrade_the_release(cluster: ControlPlane, installer: addons.AnsibleAddons) -> None:
    kubeconfig = cluster.kubeconfig.read_text()
    assert addons.classify(installer.run_blocking("c1", kubeconfig, request())).ok
    before = json.loads(helm(cluster, "list", "-n", NS, "-o", "json"))[0]["revision"]
    upgraded = addons.classify(installer.run_blocking("c1", kubeconfig, request(extra_values={"logVerbosity": "6"})))
    assert upgraded.ok, upgraded.message
    assert upgraded.changed > 0
    after = json.loads(helm(cluster, "list", "-n", NS, "-o", "json"))[0]
    assert int(after["revision"]) == int(before) + 1
    ds = cluster.kube().get(DAEMONSETS, "dra-driver-nvidia-gpu-kubelet-plugin", NS)
    args = " ".join(a for c in ds["spec"]["template"]["spec"]["containers"] for a in c.get("args", []))
    env = json.dumps([c.get("env", []) for c in ds["spec"]["template"]["spec"]["containers"]])
    assert "6" in args or '"LOG_VERBOSITY", "value": "6"' in env


def test_a_chart_that_cannot_be_fetched_is_its_own_failure(
    cluster: ControlPlane, installer: addons.AnsibleAddons, tmp_path: Path
) -> None:
    out = addons.classify(
        installer.run_blocking("c2", cluster.kubeconfig.read_text(), request(chart_ref=str(tmp_path / "gone.tgz")))
    )
    assert not out.ok
    assert out.failure is addons.Failure.CHART_UNAVAILABLE, out.message
    assert cluster.token not in out.message


def test_values_the_chart_refuses_are_their_own_failure(cluster: ControlPlane, installer: addons.AnsibleAddons) -> None:
    # The chart's validation template fails on an explicit `namespace` value.
    refused = request(extra_values={"namespace": "elsewhere"})
    out = addons.classify(installer.run_blocking("c3", cluster.kubeconfig.read_text(), refused))
    assert not out.ok
    assert out.failure is addons.Failure.VALUES_INVALID, out.message
    assert cluster.token not in out.message
    # Nothing half-installed: the earlier release still serves its DaemonSet, and the run after a fix succeeds.
    cluster.kube().get(DAEMONSETS, "dra-driver-nvidia-gpu-kubelet-plugin", NS)
    assert addons.classify(installer.run_blocking("c3", cluster.kubeconfig.read_text(), request())).ok


def test_opting_out_leaves_the_driver_to_the_user(cluster: ControlPlane, installer: addons.AnsibleAddons) -> None:
    out = addons.classify(
        installer.run_blocking(
            "c4", cluster.kubeconfig.read_text(), request(manage_dra_driver=False, chart_ref="/nonexistent")
        )
    )
    assert out.ok, out.message  # the chart task is skipped: a missing chart does not matter
    with pytest.raises(NotFound):
        cluster.kube().get(DAEMONSETS, "no-such", NS)


def test_every_shipped_claim_template_names_a_class_the_chart_creates_and_attributes_the_driver_publishes() -> None:
    rendered = helm_template()
    classes = {d["metadata"]["name"]: d for d in rendered if d.get("kind") == "DeviceClass"}
    gate = yaml.safe_load((binaries.REPO / "config" / "dra" / "gate-deviceclass.yaml").read_text())
    classes[gate["metadata"]["name"]] = gate
    published = published_attributes()
    problems = []
    for path in sorted((binaries.REPO / "config" / "dra" / "claims").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "ResourceClaimTemplate":
                continue
            for req in doc["spec"]["spec"]["devices"]["requests"]:
                for sub in [req["exactly"]] if "exactly" in req else req["firstAvailable"]:
                    problems += claim_problems(doc["metadata"]["name"], sub, classes, published)
    assert problems == []


def helm_template() -> list[dict[str, object]]:
    return list(nvidia_chart.rendered())


def published_attributes() -> dict[str, set[str]]:
    """What the simulated NVIDIA plugin publishes per device type (it stands in for the driver's slices)."""
    gpu = dra_publisher.GpuFacts("GPU-1", "RTX PRO 6000", "Blackwell", "Nvidia", "0000:01:00.0", "575.57.08",
                                 "12.9", "12.0", 97000, True)  # fmt: skip
    mig = dra_publisher.MigFacts("1g.24gb", 14, 1, 0, 1, "MIG-1", 46, 1, 1, 1, 1, 0, 24000)
    full = dra_publisher.build_devices(dataclasses.replace(gpu, mig_enabled=False), [])
    return {
        "gpu": set(full[0]["attributes"]),
        "mig": set(dra_publisher.build_devices(gpu, [mig])[0]["attributes"]),
    }


def claim_problems(
    name: str, sub: dict[str, object], classes: dict[str, dict[str, object]], published: dict[str, set[str]]
) -> list[str]:
    cls = str(sub["deviceClassName"])
    if cls not in classes:
        return [f"{name}: DeviceClass {cls} is neither the chart's nor ours"]
    if cls == domain.GATE_DEVICE_CLASS:
        return []
    selector = json.dumps(classes[cls]["spec"])
    dtype = re.search(r"\.type == '(\w+)'", selector)
    attrs = published.get(dtype.group(1) if dtype else "", set())
    out = []
    for sel in sub.get("selectors") or []:  # type: ignore[attr-defined]
        for attr in re.findall(r'device\.attributes\["gpu\.nvidia\.com"\]\.(\w+)', sel["cel"]["expression"]):
            if attr not in attrs:
                out.append(f"{name}: selects gpu.nvidia.com/{attr}, which the driver does not publish on {cls}")
    return out
