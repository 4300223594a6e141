"""The template controller on the real apiserver: scale-from-zero capacity from the inspected hosts the
hostSelector matches (the minimum across them), nodeInfo, a condition when nothing matches, and the
standby pool taking exactly `size` Available hosts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from capi_gpu import domain
from capi_gpu.api.host import DiskInfo, GPUInfo, HardwareDetails, HetznerGPUHost, HetznerGPUHostSpec, HostState
from capi_gpu.controllers import template_loop
from capi_gpu.kube import AsyncKube, Kube, ours
from capi_gpu.provisioning.ansible import AnsibleRunner
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import Settings
from capi_gpu_sim.controlplane import ControlPlane

pytestmark = pytest.mark.integration
HOSTS, TEMPLATES = ours("hetznergpuhosts"), ours("hetznergpumachinetemplates")
GIB = 1024**3


def gex131(threads: int = 48, mem_mib: int = 257672, disk_gb: int = 960) -> HardwareDetails:
    """What inspection records for a simulated GEX131 (nproc, MemTotal, two NVMe, one RTX PRO 6000)."""
    disks = [
        DiskInfo(wwn=f"eui.3634483{i}", size_bytes=disk_gb * 10**9, model="SAMSUNG MZQL2960HCJR-00A07")
        for i in range(2)
    ]
    gpu = GPUInfo(vendor_id="10de", device_id="2bb5", model="rtx-pro-6000", mig_capable=True)
    return HardwareDetails(cpu_threads=threads, memory_mib=mem_mib, disks=disks, gpus=[gpu])


def add_host(kube: Kube, ns: str, n: int, hw: HardwareDetails | None, state: HostState = HostState.AVAILABLE) -> str:
    name = f"h{n}"
    body = HetznerGPUHost(
        metadata={"name": name, "labels": {domain.LABEL_GPU_PRESENT: "true", "pool": "a"}},
        spec=HetznerGPUHostSpec(server_number=n),
    ).wire()
    body.pop("status")
    kube.create(HOSTS, body, ns)
    status: dict[str, Any] = {"state": state.value}
    if hw is not None:
        status["hardware"] = hw.wire()
    kube.patch(HOSTS, name, {"status": status}, ns, sub="status")
    return name


@pytest.fixture
async def deps(control_plane: ControlPlane, tmp_path: Path) -> AsyncIterator[Deps]:
    settings = Settings()
    d = Deps(AsyncKube(control_plane.kube()), settings, AnsibleRunner(artifacts_root=tmp_path), RobotClients(settings))
    yield d
    d.kube.close()


def template(kube: Kube, ns: str, selector: dict[str, str], standby: int = 0) -> None:
    kube.create(
        TEMPLATES,
        {
            "apiVersion": domain.API_VERSION,
            "kind": "HetznerGPUMachineTemplate",
            "metadata": {"name": "gpu"},
            "spec": {
                "standby": {"size": standby},
                "template": {
                    "spec": {"hostSelector": {"matchLabels": selector}, "gpu": {"layout": {"preset": "all-1g.24gb"}}}
                },
            },
        },
        ns,
    )


async def test_capacity_is_the_smallest_matching_gex131(kube: Kube, namespace: str, deps: Deps) -> None:
    add_host(kube, namespace, 1, gex131())
    add_host(kube, namespace, 2, gex131(threads=32, mem_mib=131072))  # a smaller host also matches
    template(kube, namespace, {"pool": "a"})
    assert await template_loop.reconcile(deps, namespace, "gpu") is not None
    st = kube.get(TEMPLATES, "gpu", namespace)["status"]
    assert st["capacity"] == {"cpu": "32", "memory": "131072Mi", "ephemeral-storage": "894Gi", "nvidia.com/gpu": "1"}
    assert st["nodeInfo"] == {"architecture": "amd64", "operatingSystem": "linux"}
    assert st["matchingHosts"] == 2
    cond = {c["type"]: c for c in st["conditions"]}["CapacityKnown"]
    assert (cond["status"], cond["reason"]) == ("True", "CapacityFromHosts")


async def test_no_matching_host_is_a_condition_not_a_guess(kube: Kube, namespace: str, deps: Deps) -> None:
    add_host(kube, namespace, 3, gex131())
    template(kube, namespace, {"pool": "elsewhere"})
    await template_loop.reconcile(deps, namespace, "gpu")
    st = kube.get(TEMPLATES, "gpu", namespace)["status"]
    assert "capacity" not in st or st["capacity"] is None
    cond = {c["type"]: c for c in st["conditions"]}["CapacityKnown"]
    assert (cond["status"], cond["reason"]) == ("False", "NoMatchingHosts")


async def test_standby_pool_takes_exactly_size_available_hosts(kube: Kube, namespace: str, deps: Deps) -> None:
    for n in (4, 5, 6):
        add_host(kube, namespace, n, gex131())
    template(kube, namespace, {"pool": "a"}, standby=2)
    await template_loop.reconcile(deps, namespace, "gpu")
    await template_loop.reconcile(deps, namespace, "gpu")  # idempotent: a second pass changes nothing
    standby = [h for h in kube.list(HOSTS, namespace) if (h["spec"].get("standby") or {}).get("template") == "gpu"]
    assert [h["metadata"]["name"] for h in standby] == ["h4", "h5"]
    assert standby[0]["spec"]["standby"]["gpu"]["layout"]["preset"] == "all-1g.24gb"
    kube.patch(TEMPLATES, "gpu", {"spec": {"standby": {"size": 0}}}, namespace)
    await template_loop.reconcile(deps, namespace, "gpu")
    assert not [h for h in kube.list(HOSTS, namespace) if h["spec"].get("standby")]
