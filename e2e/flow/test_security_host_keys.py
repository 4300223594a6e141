"""A swapped host key means no connection, for the rescue system and for the installed OS. The rescue system
of one host presents a key other than the one Robot reported for its activation; another host's install
leaves an OS host key other than the one the controller generated and pinned. Each ends in a permanent
HostKeyMismatch with a Warning Event, before any credential is offered or anything runs on the host: its sshd
never saw a login attempt, no installimage, no Ansible, no bootstrap, and no Robot reset after the verdict.

The dev cluster's MachineHealthCheck is removed: its remediation would reset the refused host."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

import pytest
from fault_kit import (
    claimed_host,
    gpu_machines,
    host_name,
    ops,
    resets,
    robot_log,
    status,
    until,
    wait_event,
)

from capi_gpu.kube import CAPI_MHCS
from capi_gpu_sim.hosts.host import Host
from capi_gpu_sim.world import World

FIRST = 2_000_001  # FleetConfig's first server number
IMPOSTOR = FIRST + 1  # its rescue system presents keys Robot never reported
# What OpenSSH's sshd logs once a client gets as far as authenticating (none of it may appear).
LOGIN_TRACES = ("Accepted ", "Failed publickey", "Failed password", "Failed none", "Postponed", "Invalid user",
                "session opened", "authenticating user")  # fmt: skip


@pytest.fixture(scope="module")
def keys_world(world_factory: Callable[..., World]) -> Iterator[World]:
    world = world_factory(hosts=2, robot_faults={"impostor_rescue": [IMPOSTOR]})
    world.k.delete(CAPI_MHCS, f"{world.config.cluster}-gpu", world.config.namespace)
    yield world


def _mismatch(world: World, number: int) -> dict[str, object] | None:
    st = status(world, number)
    return st if st.get("errorType") == "HostKeyMismatch" else None


def _console(host: Host, boot: int) -> str:
    return (host.state_dir / "boots" / str(boot) / "console.log").read_text(errors="replace")


def _hung_up(log: str) -> str | None:
    """``log`` once sshd has logged our hang-up in the key exchange."""
    return log if "Connection closed by" in log else None


def test_a_rescue_system_with_a_key_robot_did_not_report_is_refused_before_any_login(keys_world: World) -> None:
    world = keys_world
    assert world.fleet is not None
    host = world.fleet.host(IMPOSTOR)
    refused = until("the impostor rescue refused", lambda: _mismatch(world, IMPOSTOR), 90, world)
    assert refused["state"] == "Error" and refused["errorPermanent"] is True, refused
    assert "is not the pinned one" in str(refused["errorMessage"]), refused["errorMessage"]
    warned = wait_event(world, host_name(IMPOSTOR), "HostKeyMismatch")
    assert warned[0]["type"] == "Warning", warned
    # The host did boot the rescue system (the reset was real), and its sshd never saw a login attempt.
    rescue_boot = host.boot_count()
    assert rescue_boot == 2 and host.boots[-1].running.value == "rescue", host.boots
    # We did connect, and hung up in the key exchange; sshd logs that on its own, maybe after our status write.
    console = until("sshd's hang-up in the console", lambda: _hung_up(_console(host, rescue_boot)), 10, world)
    assert not [t for t in LOGIN_TRACES if t in console], console[-2000:]
    assert host.installimage_runs() == []
    assert not (status(world, IMPOSTOR).get("hardware")), "inspected through a connection it should have refused"
    # One reset brought it into rescue; after the verdict, nothing more.
    assert [e.detail for e in resets(world, IMPOSTOR)] == ["sw"]
    time.sleep(2)
    assert [e.detail for e in resets(world, IMPOSTOR)] == ["sw"]
    assert status(world, IMPOSTOR).get("state") == "Error"


def test_an_installed_os_with_a_key_other_than_the_pinned_one_is_refused_before_anything_runs(
    keys_world: World,
) -> None:
    world = keys_world
    assert world.fleet is not None
    host = world.fleet.host(FIRST)
    until("the honest host inspected", lambda: status(world, FIRST).get("state") == "Available", 90, world)
    host.set_hardware(dataclasses.replace(host.hw, extra={**host.hw.extra, "installimage_replaces_hostkey": True}))
    since = len(robot_log(world))
    world.scale(1)
    until("the honest host claimed", lambda: any(claimed_host(world, m["metadata"]["name"]) == FIRST
                                                  for m in gpu_machines(world)), 60, world)  # fmt: skip
    refused = until("the installed OS refused", lambda: _mismatch(world, FIRST), 150, world)
    assert refused["step"] == "RebootOS" and refused["errorPermanent"] is True, refused
    assert "is not the pinned one" in str(refused["errorMessage"])
    # It really is our install, booted: one installimage run, then the OS (a new boot) answered with its own key.
    runs = host.installimage_runs()
    assert [r["event"] for r in runs] == ["start", "end"] and runs[-1]["rc"] == 0, runs
    assert host.boots[-1].running.value == "installed", host.boots
    pinned = status(world, FIRST)["hostKeys"]["os"].split()[1]
    presented = host.read_file("/etc/ssh/ssh_host_ed25519_key.pub")
    assert presented is not None and pinned not in presented.decode()
    # Nothing ran on it: no Ansible, no bootstrap (cloud-init still disabled), no login attempt in sshd's log.
    names = [o["name"] for o in ops(world, FIRST)]
    assert "configure" not in names and "bootstrap" not in names, names
    volumes = world.artifacts_dirs()  # the manager pod's artifacts volume, where every Ansible run leaves its own
    assert volumes and all(v.is_dir() for v in volumes), volumes
    ran = [p for v in volumes if (v / host_name(FIRST)).exists() for p in (v / host_name(FIRST)).iterdir()]
    assert ran == [], ran
    assert host.read_file("/etc/cloud/cloud-init.disabled") is not None
    assert host.read_file("/var/lib/kubelet/sim-join.json") is None

    def journal() -> str:
        return host.exec(["journalctl", "--no-pager", "-o", "cat"], timeout=30).stdout.decode(errors="replace")

    # We did connect, and hung up in the key exchange; sshd logs that on its own, maybe after our status write.
    log = until("sshd's hang-up in the journal", lambda: _hung_up(journal()), 10, world)
    console = _console(host, host.boot_count())
    assert not [t for t in LOGIN_TRACES if t in log + console], (log + console)[-2000:]
    # The SSH reboot into the OS was the last thing sent; no Robot reset since the claim.
    assert resets(world, FIRST, since) == []
