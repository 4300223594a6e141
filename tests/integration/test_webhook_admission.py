"""The validating webhook behind the real kube-apiserver, served by `capi-gpu run` with a certificate from
the control plane's CA (the shipped config/webhook configuration, pointed at loopback): `kubectl apply`
of a layout the GPU can't hold is refused with the nearest valid layout; a driver branch without MIG and
a second host for one Robot server are refused; good objects pass; a metadata-only update of an object
that predates the webhook passes; and with the webhook down, our kinds are refused while others are not."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from capi_gpu.kube import NAMESPACES, SECRETS, Invalid, Kube, KubeError, ours
from capi_gpu_sim import binaries
from capi_gpu_sim import webhook as simhook
from capi_gpu_sim.controlplane import ControlPlane, free_port

pytestmark = pytest.mark.integration

SAMPLES = binaries.REPO / "config" / "samples"
HOSTS, MACHINES, TEMPLATES = ours("hetznergpuhosts"), ours("hetznergpumachines"), ours("hetznergpumachinetemplates")
Obj = dict[str, Any]


def sample(kind: str) -> Obj:
    for path in SAMPLES.glob("hetznergpu*.yaml"):
        doc: Obj = yaml.safe_load(path.read_text())
        if doc["kind"] == kind:
            return doc
    raise AssertionError(kind)


@dataclass
class Hook:
    kube: Kube
    cp: ControlPlane
    label: dict[str, str]
    proc: subprocess.Popen[bytes]

    def namespace(self, opt_in: bool = True) -> str:
        name = f"w-{uuid.uuid4().hex[:8]}"
        labels = self.label if opt_in else {}
        self.kube.create(
            NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
        )
        return name

    def kubectl_apply(self, doc: Obj, namespace: str) -> subprocess.CompletedProcess[str]:
        kubectl = binaries.locate().kubectl
        args = [str(kubectl), "--kubeconfig", str(self.cp.kubeconfig), "apply", "-n", namespace, "-f", "-"]
        return subprocess.run(args, input=yaml.safe_dump(doc), capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def hook(kube: Kube, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hook]:
    tmp = tmp_path_factory.mktemp("webhook")
    certs = simhook.serving_cert(control_plane.ca, tmp / "certs")
    port = free_port()
    # The operator watches an empty namespace of its own: it only serves the webhook to this module.
    idle = f"idle-{uuid.uuid4().hex[:6]}"
    kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": idle}})
    argv = [
        sys.executable, "-m", "capi_gpu.cli", "run", "--kubeconfig", str(control_plane.kubeconfig),
        "--namespace", idle, "--no-gate", "--metrics-port", "0", "--liveness", "",
        "--artifacts-dir", str(tmp / "artifacts"), *simhook.operator_args(port, certs),
    ]  # fmt: skip
    log = (tmp / "operator.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=binaries.REPO)
    log.close()
    label = {"capi-gpu.test/webhook": uuid.uuid4().hex[:8]}
    name = simhook.install(kube, control_plane.ca, port, f"capi-gpu-test-{label['capi-gpu.test/webhook']}", label)
    try:
        for _ in range(120):
            assert proc.poll() is None, (tmp / "operator.log").read_text()
            if simhook.listening(port):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"webhook not serving after 60s:\n{(tmp / 'operator.log').read_text()}")
        yield Hook(kube, control_plane, label, proc)
    finally:
        simhook.uninstall(kube, name)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        kube.delete(NAMESPACES, idle)


def test_kubectl_apply_of_an_impossible_layout_is_refused_with_a_valid_one(hook: Hook) -> None:
    ns = hook.namespace()
    mt = sample("HetznerGPUMachineTemplate")
    mt["spec"]["template"]["spec"]["gpu"] = {
        "model": "rtx-pro-6000",
        "layout": {"profiles": {"1g.24gb": 3, "2g.48gb": 1}},
    }
    out = hook.kubectl_apply(mt, ns)
    assert out.returncode != 0
    assert (
        'admission webhook "hetznergpumachinetemplate.validation.infrastructure.cluster.x-k8s.io" denied' in out.stderr
    )
    assert "spec.template.spec.gpu.layout: ImpossibleLayout: layout 1g.24gb=3,2g.48gb=1 does not fit" in out.stderr
    assert "Nearest valid layouts: 1g.24gb=2,2g.48gb=1" in out.stderr
    mt["spec"]["template"]["spec"]["gpu"]["layout"] = {"profiles": {"1g.24gb": 2, "2g.48gb": 1}}
    assert hook.kubectl_apply(mt, ns).returncode == 0


def test_driver_branch_without_mig_is_refused(hook: Hook) -> None:
    ns = hook.namespace()
    m = sample("HetznerGPUMachine")
    m["spec"]["gpu"]["driverBranch"] = "570"
    with pytest.raises(Invalid) as err:
        hook.kube.create(MACHINES, m, ns)
    assert "spec.gpu.driverBranch: DriverTooOld" in err.value.message
    assert "use driverBranch 575 or later" in err.value.message


def test_a_second_host_for_one_server_is_refused(hook: Hook) -> None:
    first_ns, ns = hook.namespace(opt_in=False), hook.namespace()
    hook.kube.create(HOSTS, sample("HetznerGPUHost"), first_ns)
    with pytest.raises(Invalid) as err:
        hook.kube.create(HOSTS, sample("HetznerGPUHost") | {"metadata": {"name": "again"}}, ns)
    assert "spec.serverNumber: DuplicateServer: server 1234567 already has HetznerGPUHost" in err.value.message
    assert f"{first_ns}/gex131-1234567" in err.value.message
    other = sample("HetznerGPUHost") | {"metadata": {"name": "other"}}
    other["spec"] = {**other["spec"], "serverNumber": 2345678}
    assert hook.kube.create(HOSTS, other, ns)["metadata"]["uid"]
    # Its own updates are no duplicate of itself.
    hook.kube.patch(HOSTS, "other", {"spec": {"description": "moved rack"}}, ns)
    hook.kube.delete(HOSTS, "gex131-1234567", first_ns)


def test_a_chart_ref_outside_the_operators_registries_is_refused(hook: Hook) -> None:
    """Issue 29: helm would fetch it as the operator. The operator here runs without chart flags: only
    NVIDIA's registry is allowed."""
    ns = hook.namespace()
    cluster = sample("HetznerGPUCluster")
    cluster["spec"]["addons"] = {"draDriver": {"chartRef": "oci://evil.example/charts/dra-driver-nvidia-gpu"}}
    out = hook.kubectl_apply(cluster, ns)
    assert out.returncode != 0
    assert 'admission webhook "hetznergpucluster.validation.infrastructure.cluster.x-k8s.io" denied' in out.stderr
    assert "spec.addons.draDriver.chartRef: ChartRefNotAllowed" in out.stderr
    assert "registry evil.example is not one the operator allows" in out.stderr
    cluster["spec"]["addons"]["draDriver"]["chartRef"] = "oci://registry.k8s.io/dra-driver-nvidia/charts/x"
    assert hook.kubectl_apply(cluster, ns).returncode == 0


def test_every_sample_passes_the_webhook(hook: Hook) -> None:
    ns = hook.namespace()
    for path in sorted(SAMPLES.glob("hetznergpu*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc["kind"] == "HetznerGPUHost":
            doc["spec"]["serverNumber"] = 3456789  # the sample's number is another test's
        out = hook.kubectl_apply(doc, ns)
        assert out.returncode == 0, (path.name, out.stderr)


def test_an_object_from_before_the_webhook_takes_metadata_updates_not_spec_edits(hook: Hook) -> None:
    ns = hook.namespace(opt_in=False)
    bad = sample("HetznerGPUMachine")
    bad["spec"]["gpu"]["layout"] = {"profiles": {"4g.96gb": 2}}
    hook.kube.create(MACHINES, bad, ns)  # not yet under the webhook: as if created before it existed
    hook.kube.patch(NAMESPACES, ns, {"metadata": {"labels": hook.label}})
    name = bad["metadata"]["name"]
    hook.kube.patch(MACHINES, name, {"metadata": {"finalizers": ["example.com/keep"]}}, ns)
    hook.kube.patch(MACHINES, name, {"metadata": {"finalizers": None}}, ns)
    with pytest.raises(Invalid, match=r"spec\.gpu\.layout: ImpossibleLayout"):
        hook.kube.patch(MACHINES, name, {"spec": {"kubernetesVersion": "v1.36.3"}}, ns)


def test_with_the_webhook_down_only_our_kinds_are_refused(hook: Hook, tmp_path: Path) -> None:
    label = {"capi-gpu.test/webhook-down": uuid.uuid4().hex[:8]}
    name = simhook.install(
        hook.kube, hook.cp.ca, free_port(), f"capi-gpu-down-{label['capi-gpu.test/webhook-down']}", label
    )
    try:
        ns = f"d-{uuid.uuid4().hex[:8]}"
        hook.kube.create(
            NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": label}}
        )
        with pytest.raises(KubeError, match="failed calling webhook"):
            hook.kube.create(MACHINES, sample("HetznerGPUMachine"), ns)
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"k": "v"}}
        assert hook.kube.create(SECRETS, secret, ns)["metadata"]["uid"]
        # HetznerGPUCluster is under the webhook too (its chartRef allow-list, issue 29); remediations are not.
        with pytest.raises(KubeError, match="failed calling webhook"):
            hook.kube.create(ours("hetznergpuclusters"), sample("HetznerGPUCluster"), ns)
        assert hook.kube.create(ours("hetznergpuremediations"), sample("HetznerGPURemediation"), ns)["metadata"]["uid"]
    finally:
        simhook.uninstall(hook.kube, name)
