"""The HetznerGPUCluster reconcile installs the workload cluster's DRA add-ons through the real playbook run
(ansible-runner, kubernetes.core, helm, the real dra-driver-nvidia-gpu 0.4.1 chart) on a real kube-apiserver:
AddonsReady waits for the workload kubeconfig, turns True naming the chart version once the chart's
DeviceClasses exist, a second reconcile runs nothing, a chart that can't be fetched is a False condition
with its own reason and a retry, and opting out of the driver leaves the chart alone."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from capi_gpu import domain
from capi_gpu.controllers import cluster_loop
from capi_gpu.kube import DEVICECLASSES, NAMESPACES, AsyncKube, Kube, ours
from capi_gpu.provisioning import addons
from capi_gpu.provisioning.ansible import AnsibleRunner
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import Settings
from capi_gpu_sim import binaries, controlplane
from capi_gpu_sim.controlplane import ControlPlane, Options

pytestmark = pytest.mark.integration

CHART = binaries.REPO.parent / "shared" / "upstream" / "dra-driver-nvidia-gpu-0.4.1.tgz"
CLUSTERS = ours("hetznergpuclusters")


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """An apiserver of its own: the chart owns cluster-wide DeviceClasses that other tests' worlds create by hand."""
    opts = Options(with_scheduler=False, with_controller_manager=False, with_capi=False)
    with ControlPlane(tmp_path_factory.mktemp("cluster-addons-cp"), opts) as plane:
        yield plane


class Counting:
    """The real installer, counting its runs (a second reconcile must not run the playbook)."""

    def __init__(self, real: addons.AnsibleAddons) -> None:
        self.real, self.runs = real, 0
        self.playbook_dir = real.playbook_dir

    async def install(self, cluster: str, kubeconfig: str, request: addons.AddonsRequest) -> addons.AddonsOutcome:
        self.runs += 1
        return await self.real.install(cluster, kubeconfig, request)


@pytest.fixture
async def deps(cp: ControlPlane, tmp_path: Path) -> AsyncIterator[Deps]:
    settings = Settings(addons_chart=str(CHART), helm=str(binaries.ensure_helm()))
    installer = Counting(addons.AnsibleAddons(tmp_path / "addons", helm_binary=settings.helm))
    d = Deps(AsyncKube(cp.kube()), settings, AnsibleRunner(artifacts_root=tmp_path), RobotClients(settings))
    d.addons = installer
    yield d
    d.kube.close()


def make_cluster(kube: Kube, ns: str, name: str, addons_spec: dict[str, Any] | None = None) -> None:
    kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    spec: dict[str, Any] = {"robotCredentials": {"name": "robot"}, "sshKeys": {"rescue": {"name": "ssh"}}}
    if addons_spec is not None:
        spec["addons"] = addons_spec
    owner = {"apiVersion": domain.CAPI_API_VERSION, "kind": "Cluster", "name": name, "uid": "0000-1"}
    meta = {"name": name, "ownerReferences": [owner]}
    kube.create(
        CLUSTERS, {"apiVersion": domain.API_VERSION, "kind": "HetznerGPUCluster", "metadata": meta, "spec": spec}, ns
    )


def condition(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    obj = kube.get(CLUSTERS, name, ns)
    return next(c for c in obj["status"]["conditions"] if c["type"] == "AddonsReady")


async def test_a_new_cluster_gets_the_chart_once_its_api_answers_and_a_second_reconcile_runs_nothing(
    cp: ControlPlane, deps: Deps
) -> None:
    kube = cp.kube()
    make_cluster(kube, "a1", "c1")
    await cluster_loop.reconcile(deps, "a1", "c1")
    waiting = condition(kube, "a1", "c1")
    assert (waiting["status"], waiting["reason"]) == ("False", "WaitingForControlPlane")
    assert "0.4.1" in waiting["message"]

    cp.write_workload_kubeconfig("c1", "a1")
    await cluster_loop.reconcile(deps, "a1", "c1")
    ready = condition(kube, "a1", "c1")
    assert (ready["status"], ready["reason"]) == ("True", "AddonsInstalled"), ready["message"]
    assert "dra-driver-nvidia-gpu 0.4.1" in ready["message"]
    assert {"gpu.nvidia.com", "mig.nvidia.com", domain.GATE_DEVICE_CLASS} <= {
        c["metadata"]["name"] for c in kube.list(DEVICECLASSES)
    }
    conds = {c["type"]: c for c in kube.get(CLUSTERS, "c1", "a1")["status"]["conditions"]}
    assert (conds["GateFeaturesAvailable"]["status"], conds["GateFeaturesAvailable"]["reason"]) == (
        "True",
        "FeaturesAvailable",
    )
    status = kube.get(CLUSTERS, "c1", "a1")["status"]["addons"]
    assert status["chartVersion"] == "0.4.1" and status["appliedDigest"]
    runs = deps.addons.runs  # type: ignore[union-attr]
    assert runs == 1

    await cluster_loop.reconcile(deps, "a1", "c1")
    assert deps.addons.runs == runs  # type: ignore[union-attr]
    assert condition(kube, "a1", "c1")["lastTransitionTime"] == ready["lastTransitionTime"]


async def test_a_chart_that_cannot_be_fetched_is_a_false_condition_and_a_retry(cp: ControlPlane, deps: Deps) -> None:
    kube = cp.kube()
    # The operator's own chart (its --addons-chart) is gone: a tenant may no longer name a path (issue 29).
    deps.settings = deps.settings.model_copy(update={"addons_chart": "/nonexistent/dra-driver-nvidia-gpu-0.4.1.tgz"})
    make_cluster(kube, "a2", "c2")
    cp.write_workload_kubeconfig("c2", "a2")
    requeue = await cluster_loop.reconcile(deps, "a2", "c2")
    failed = condition(kube, "a2", "c2")
    assert (failed["status"], failed["reason"]) == ("False", "ChartUnavailable"), failed["message"]
    assert "0.4.1" in failed["message"]
    assert cp.token not in failed["message"]
    assert requeue is not None and requeue <= 60
    # The retry runs the playbook again (a failure is never taken as applied).
    await cluster_loop.reconcile(deps, "a2", "c2")
    assert deps.addons.runs == 2  # type: ignore[union-attr]


async def test_opting_out_of_the_driver_installs_only_the_gate_and_claims(cp: ControlPlane, deps: Deps) -> None:
    kube = cp.kube()
    make_cluster(
        kube,
        "a3",
        "c3",
        {
            "draDriver": {"managed": False, "chartRef": "oci://registry.k8s.io/no/such-chart"},
            "claimNamespaces": ["team-b"],
        },
    )
    cp.write_workload_kubeconfig("c3", "a3")
    await cluster_loop.reconcile(deps, "a3", "c3")
    ready = condition(kube, "a3", "c3")
    assert (ready["status"], ready["reason"]) == ("True", "AddonsInstalled"), ready["message"]
    assert "unmanaged" in ready["message"]
    assert "chartVersion" not in kube.get(CLUSTERS, "c3", "a3")["status"]["addons"]


@pytest.fixture(scope="module")
def cp_without_taints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A workload apiserver with device taints and binding conditions switched off."""
    opts = Options(with_scheduler=False, with_controller_manager=False, with_capi=False)
    plane = ControlPlane(tmp_path_factory.mktemp("no-taints-cp"), opts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(controlplane, "FEATURE_GATES", "DRADeviceTaints=false,DRADeviceBindingConditions=false")
        plane.start()
    try:
        yield plane
    finally:
        plane.stop()


async def test_an_apiserver_that_drops_the_gate_fields_is_named_with_its_feature_gates(
    cp_without_taints: ControlPlane, tmp_path: Path
) -> None:
    plane = cp_without_taints
    kube = plane.kube()
    settings = Settings(addons=False)
    d = Deps(AsyncKube(plane.kube()), settings, AnsibleRunner(artifacts_root=tmp_path), RobotClients(settings))
    try:
        make_cluster(kube, "b1", "c5")
        plane.write_workload_kubeconfig("c5", "b1")
        await cluster_loop.reconcile(d, "b1", "c5")
        conds = {c["type"]: c for c in kube.get(CLUSTERS, "c5", "b1")["status"]["conditions"]}
        missing = conds["GateFeaturesAvailable"]
        assert (missing["status"], missing["reason"]) == ("False", "FeaturesMissing"), missing
        assert "DRADeviceTaints" in missing["message"] and "DRADeviceBindingConditions" in missing["message"]
        assert "AddonsReady" not in conds  # --no-addons: nothing installed, nothing said about it
    finally:
        d.kube.close()
