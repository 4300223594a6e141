"""site.yml against a simulated host as strict as a fresh real GEX131: the image has no index for its archive
(dkms, X libraries, conntrack live only there), the CUDA repository's branch-suffixed names, DKMS builds a
module only with the running kernel's headers, nvidia-smi and nvidia-persistenced answer only with the module
loaded, Ubuntu's persistenced unit turns persistence mode off, nouveau holds the GPU until the initramfs that
loads it is regenerated with a blacklist, the MIG boot unit gates kubelet, --check predicts without failing, and
a kernel update landing mid-run gets its module and initramfs and a reboot into it; the default route (auto) takes
Ubuntu's precompiled module where the archive has it, and a host never gets the other route's driver on top.
Each test here fails on the playbooks from before these rules."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from typing import Any

import pytest

from capi_gpu.provisioning import ansible, ansible_events
from capi_gpu_sim import host_shims
from e2e.test_playbooks_on_sim_host import LAYOUT, Node, node_factory, site_vars, world

pytestmark = pytest.mark.e2e
__all__ = ["node_factory", "world"]  # fixtures shared with the main playbook test

KERNEL = os.uname().release  # the guest runs the test machine's kernel


def wait_settled(node: Node, unit: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = node.sh("systemctl", "is-active", unit, ok=False).strip()
        if state not in ("activating", "deactivating", "reloading", ""):
            return state
        time.sleep(0.2)
    return state


async def test_a_fresh_image_gets_the_archive_headers_module_and_persistence_mode_and_check_mode_predicts(
    world: Any, node_factory: Any
) -> None:
    node: Node = node_factory()
    # --check on the fresh image: a prediction that stops where the driver would be needed, never a failure.
    check = ansible.AnsibleRunner(artifacts_root=node.runner.artifacts_root, timeout_s=900, check_mode=True)
    started = time.monotonic()
    predicted = await check.prepare_node(node.target, site_vars(world.repo))
    check_s = time.monotonic() - started
    assert predicted.status is ansible_events.RunStatus.SUCCEEDED, predicted.failed
    assert node.sh("dpkg-query", "-W", "nvidia-driver-580-open", ok=False) == "", "--check installed something"

    started = time.monotonic()
    first = await node.runner.prepare_node(node.target, site_vars(world.repo))
    first_s = time.monotonic() - started
    assert first.status is ansible_events.RunStatus.SUCCEEDED, first.failed
    # The archive's index was refreshed (the image came without one) and its packages installed.
    assert node.sh("dpkg-query", "-W", "-f=${Status}", "dkms", "conntrack").count("install ok installed") == 2
    # Headers for the running kernel came first, so DKMS built the module for it.
    assert "install ok installed" in node.sh("dpkg-query", "-W", "-f=${Status}", f"linux-headers-{KERNEL}")
    node.sh("test", "-e", f"/lib/modules/{KERNEL}/updates/dkms/nvidia.ko.zst")
    # persistenced runs, with persistence mode on despite the packaged unit's --no-persistence-mode.
    assert node.sh("systemctl", "is-active", "nvidia-persistenced.service").strip() == "active"
    mode = node.sh("nvidia-smi", "--query-gpu=persistence_mode", "--format=csv,noheader").strip()
    assert mode == "Enabled"
    # nouveau: blacklisted, and the initramfs regenerated with the blacklist in it.
    assert "blacklist nouveau" in node.sh("cat", "/etc/modprobe.d/capi-gpu-blacklist-nouveau.conf")
    assert "nouveau" in json.loads(node.sh("cat", f"/boot/initrd.img-{KERNEL}"))["blacklist"]
    # kubelet requires the MIG boot unit.
    assert "capi-gpu-mig-layout.service" in node.sh("systemctl", "show", "-p", "Requires", "--value", "kubelet.service")

    drift = await check.prepare_node(node.target, site_vars(world.repo))
    assert drift.status is ansible_events.RunStatus.SUCCEEDED and drift.changed == 0, drift.failed
    print(f"\nfresh image: --check {check_s:.1f} s, first run {first_s:.1f} s ({first.changed} changed)")


async def test_nouveau_holding_the_gpu_costs_one_reboot_and_persistenced_waits_for_the_module(
    world: Any, node_factory: Any
) -> None:
    node: Node = node_factory({"nouveau_binds": True})
    assert node.sh("test", "-e", "/run/sim-kmod/nouveau", ok=False) == ""
    first = await node.runner.prepare_node(node.target, site_vars(world.repo))
    assert first.status is ansible_events.RunStatus.REBOOT_NEEDED, first.failed
    assert first.reboot_reason == "driver-not-loaded"
    # Enabled for the next boot, never started without the module (it would have failed the run).
    assert node.sh("systemctl", "is-enabled", "nvidia-persistenced.service").strip() == "enabled"
    assert wait_settled(node, "nvidia-persistenced.service") == "inactive"

    node.reboot()  # the regenerated initramfs keeps nouveau off; the nvidia module loads at boot
    assert node.sh("test", "-e", "/run/sim-kmod/nvidia", ok=False) == ""
    assert wait_settled(node, "nvidia-persistenced.service") == "active"
    second = await node.runner.prepare_node(node.target, site_vars(world.repo))
    assert second.status is ansible_events.RunStatus.SUCCEEDED, second.failed
    assert node.mig_devices() == Counter(LAYOUT)


async def test_kubelet_does_not_start_when_the_layout_cannot_be_applied_at_boot(world: Any, node_factory: Any) -> None:
    node: Node = node_factory()
    first = await node.runner.prepare_node(node.target, site_vars(world.repo))
    assert first.status is ansible_events.RunStatus.SUCCEEDED, first.failed
    # The GPU falls off the bus: nvidia-smi (and so mig-parted) fail at the next boot.
    config = "/var/lib/gpu-shim/config.json"
    knobs = json.loads(node.sh("cat", config))
    node.sh("sh", "-c", f"printf '%s' '{json.dumps({**knobs, 'lost': True})}' > {config}")
    node.reboot()
    for _ in range(120):  # a queued start job also reads "inactive": wait for the unit's outcome
        if node.sh("systemctl", "is-active", "capi-gpu-mig-layout.service", ok=False).strip() in ("active", "failed"):
            break
        await asyncio.sleep(0.5)
    assert wait_settled(node, "capi-gpu-mig-layout.service") == "failed"
    # Once the boot's jobs are done, kubelet must not be running.
    for _ in range(120):
        if "No jobs running" in node.sh("systemctl", "list-jobs", ok=False):
            break
        await asyncio.sleep(0.5)
    assert wait_settled(node, "kubelet.service") == "inactive", "kubelet started without the MIG layout"


async def test_a_kernel_update_during_the_run_gets_its_module_and_a_reboot_into_it(
    world: Any, node_factory: Any
) -> None:
    following = host_shims.next_kernel(KERNEL)
    node: Node = node_factory({"kernel_update": following})  # lands after the run's first dpkg call
    started = time.monotonic()
    first = await node.runner.prepare_node(node.target, site_vars(world.repo))
    first_s = time.monotonic() - started
    assert first.status is ansible_events.RunStatus.REBOOT_NEEDED, first.failed
    assert first.reboot_reason == "kernel-updated"
    assert node.sh("readlink", "/boot/vmlinuz").strip() == f"vmlinuz-{following}", "the update did not land"
    # The kernel the next boot starts has the module, and an initramfs that keeps nouveau off.
    node.sh("test", "-e", f"/lib/modules/{following}/updates/dkms/nvidia.ko.zst")
    assert "nouveau" in json.loads(node.sh("cat", f"/boot/initrd.img-{following}"))["blacklist"]
    assert node.sh("dpkg-query", "-W", "kubelet", ok=False) == "", "the play ends at the reboot request"
    print(f"\nkernel update mid-run: first run {first_s:.1f} s, ends asking for a reboot into {following}")


async def test_auto_takes_ubuntus_precompiled_module_where_the_archive_has_it_and_never_mixes_routes(
    world: Any, node_factory: Any
) -> None:
    node: Node = node_factory()
    started = time.monotonic()
    first = await node.runner.prepare_node(node.target, site_vars(world.repo, route=None))  # the default: auto
    first_s = time.monotonic() - started
    assert first.status is ansible_events.RunStatus.SUCCEEDED, first.failed
    installed = node.sh("dpkg-query", "-W", "-f=${db:Status-Status} ${Package}\\n")
    have = {line.split()[1] for line in installed.splitlines() if line.startswith("installed ")}
    assert {f"linux-modules-nvidia-580-server-open-{KERNEL}", "nvidia-driver-580-server-open"} <= have
    # No compiler, no headers, no DKMS, no CUDA repository: none of the other route.
    assert not have & {"dkms", "gcc", f"linux-headers-{KERNEL}", "nvidia-dkms-580-open", "nvidia-driver-580-open"}
    assert node.sh("test", "-e", "/etc/apt/sources.list.d/nvidia-cuda.list", ok=False) == ""
    assert node.sh("grep", "-rl", "NVIDIA", "/etc/apt/preferences.d", ok=False) == "", "Ubuntu's route pins nothing"
    assert node.sh("nvidia-smi", "--query-gpu=persistence_mode", "--format=csv,noheader").strip() == "Enabled"
    assert node.mig_devices() == Counter(LAYOUT)

    # Asked for the DKMS route now, the host keeps its driver: the play refuses to mix, before installing.
    mixed = await node.runner.prepare_node(node.target, site_vars(world.repo))
    assert mixed.status is ansible_events.RunStatus.FAILED and mixed.failed is not None
    assert (mixed.failed.role, mixed.failed.task) == ("nvidia_driver", "Never mix the routes")
    assert "nvidia-dkms-580-open" not in node.sh("dpkg-query", "-W", ok=False)
    print(f"\nubuntu-precompiled route: first run {first_s:.1f} s ({first.changed} changed)")
