"""What a host carries through clusterctl move: its status snapshot round-trips (without the derived
conditions), an object without status is told apart from one with status, an unreadable snapshot is
refused, a restored one is trusted only as far as Robot's address and the pinned key confirm it, and which
recorded operations keep a step open (block-move) and which do not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from capi_gpu.api.base import Condition, ConditionStatus
from capi_gpu.api.host import (
    ErrorType,
    GPUInfo,
    HardwareDetails,
    HetznerGPUHostStatus,
    HostKeys,
    HostState,
    Operation,
    Step,
)
from capi_gpu.provisioning import move

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _status(
    state: HostState, step: Step | None = None, ops: tuple[tuple[str, str | None, int], ...] = ()
) -> HetznerGPUHostStatus:
    """ops: (name, outcome, seconds after the step began; negative = before it)."""
    return HetznerGPUHostStatus(
        state=state,
        step=step,
        step_started_at=T0,
        operations=[
            Operation(name=name, requested_at=T0 + timedelta(seconds=at), outcome=outcome) for name, outcome, at in ops
        ],
    )


def test_a_snapshot_restores_everything_but_the_derived_conditions() -> None:
    status = _status(HostState.PROVISIONING, Step.CONFIGURE, (("installimage", "Sent", -60), ("reset-ssh", "Sent", -5)))
    status.host_keys = HostKeys(os="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPinned gex-1")
    status.hardware = HardwareDetails(cpu_threads=32, gpus=[GPUInfo(vendor_id="10de", device_id="2bb5", model="rtx")])
    status.prepared, status.boot_id, status.error_count = "img/layout", "b-1", 2
    status.conditions = [
        Condition(type="Ready", status=ConditionStatus.FALSE, reason="Provisioning", last_transition_time=T0)
    ]
    text = move.snapshot(status)
    assert "conditions" not in text
    restored = move.restore(text)
    assert restored.model_dump() == status.model_copy(update={"conditions": []}).model_dump()
    assert move.snapshot(restored) == text  # stable: an unchanged status never rewrites the annotation


@pytest.mark.parametrize("text", ["not json", "[]", '{"state": "Dancing"}', '{"operations": [{"name": "X"}]}'])
def test_an_unreadable_snapshot_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        move.restore(text)


@pytest.mark.parametrize(
    ("raw", "lost"),
    [(None, True), ({}, True), ({"conditions": []}, True), ({"state": "Provisioned"}, False)],
)
def test_status_lost_means_no_state_at_all(raw: object, lost: bool) -> None:
    assert move.status_lost(raw) is lost


@pytest.mark.parametrize(
    ("state", "step", "ops", "blocks"),
    [
        # rescue armed and the reset sent, rescue not reached yet: the step is open
        (HostState.PROVISIONING, Step.RESCUE, (("activate-rescue", "Sent", 1), ("reset-sw", "Sent", 2)), True),
        # recorded, not yet sent (a crash may come next): open as well
        (HostState.INSPECTING, Step.RESCUE, (("activate-rescue", None, 1),), True),
        (HostState.PROVISIONING, Step.INSTALL, (("installimage", "Sent", 1),), True),
        (HostState.PROVISIONING, Step.REBOOT_OS, (("reset-ssh", "Sent", 1),), True),
        (HostState.STANDBY_PREPARING, Step.WIPE, (("wipe", None, 1),), True),
        # nothing destructive open in this step: safe to move
        (HostState.PROVISIONING, Step.RESCUE, (), False),
        (HostState.PROVISIONING, Step.CONFIGURE, (("reset-ssh", "Sent", -30),), False),  # confirmed: step moved on
        (HostState.PROVISIONING, Step.BOOTSTRAP, (("bootstrap", None, 1),), False),  # recorded, not destructive
        (HostState.PROVISIONING, Step.RESCUE, (("activate-rescue", "Deferred", 1),), False),
        (HostState.PROVISIONING, Step.RESCUE, (("activate-rescue", "NotSent", 1),), False),
        (HostState.PROVISIONING, Step.RESCUE, (("reset-sw", "Failed: 500", 1),), False),
        (HostState.PROVISIONED, None, (("reset-ssh", "Sent", 1),), False),
        (HostState.AVAILABLE, None, (), False),
    ],
)
def test_block_move_while_a_destructive_step_is_recorded_and_unconfirmed(
    state: HostState, step: Step | None, ops: tuple[tuple[str, str | None, int], ...], blocks: bool
) -> None:
    assert move.in_flight(_status(state, step, ops)) is blocks


NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
PINNED = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPinnedPinnedPinnedPinnedPinnedPinnedPinned gex-1"


@pytest.mark.parametrize(
    ("ipv4", "os_key", "robot_ip", "pinned", "doubts"),
    [
        ("192.0.2.10", PINNED, "192.0.2.10", PINNED, []),
        ("192.0.2.10", PINNED.rsplit(" ", 1)[0] + " other-comment", "192.0.2.10", PINNED, []),  # comment isn't key
        (None, None, "192.0.2.10", PINNED, []),  # snapshot from before Registering read the address
        ("192.0.2.10", PINNED, "192.0.2.10", None, []),  # Secret not here yet: the loop waits and pins its key
        ("203.0.113.66", PINNED, "192.0.2.10", PINNED, ["ipv4"]),
        ("192.0.2.10", PINNED, None, PINNED, ["ipv4"]),  # Robot does not know the server
        ("192.0.2.10", "ssh-ed25519 AAAAforged", "192.0.2.10", PINNED, ["hostKeys.os"]),
        ("203.0.113.66", "ssh-ed25519 AAAAforged", "192.0.2.10", PINNED, ["ipv4", "hostKeys.os"]),
    ],
)
def test_a_snapshot_is_trusted_only_as_far_as_robot_and_the_pinned_key_confirm_it(
    ipv4: str | None, os_key: str | None, robot_ip: str | None, pinned: str | None, doubts: list[str]
) -> None:
    status = HetznerGPUHostStatus(state=HostState.PROVISIONED, ipv4=ipv4, host_keys=HostKeys(os=os_key))
    found = move.untrusted(status, robot_ip, pinned)
    assert [d.split(" ", 1)[0] for d in found] == doubts


def test_what_an_untrusted_snapshot_leaves_a_claimed_host_is_registering_with_the_pinned_key_only() -> None:
    fresh = move.rediscover(PINNED, True, ["ipv4 forged"], NOW, "lever")
    assert fresh == HetznerGPUHostStatus(host_keys=HostKeys(os=PINNED))
    assert fresh.state is HostState.REGISTERING and fresh.ipv4 is None and fresh.hardware is None


def test_an_unclaimed_host_with_an_untrusted_snapshot_waits_for_a_human_before_any_inspection() -> None:
    """Registering would go on to inspection, a rescue boot: a forged annotation must not order that."""
    held = move.rediscover(None, False, ["ipv4 203.0.113.66 is not Robot's"], NOW, "example.com/permanent-error")
    assert (held.state, held.error_type, held.error_permanent) == (HostState.ERROR, ErrorType.REGISTRATION, True)
    assert held.ipv4 is None and held.hardware is None and held.resume_state is None and held.last_error_at == NOW
    assert held.error_message is not None
    assert "203.0.113.66" in held.error_message and "example.com/permanent-error" in held.error_message
