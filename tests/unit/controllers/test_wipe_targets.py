"""The wipe-disk annotation: WWNs that match no disk of the host fail the step with a clear error and wipe
nothing (a typo must not shrink the wipe to the disks that happen to match); named disks or ``all`` are
wiped as asked."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from capi_gpu.api.host import DiskInfo, ErrorType, HardwareDetails, HetznerGPUHost, HetznerGPUHostSpec
from capi_gpu.controllers import host_actions
from capi_gpu.provisioning.model import Outcome

DISKS = ["0x5000c500a1b2c3d4", "0x5000c500a1b2c3d5"]


class Shell:
    def __init__(self) -> None:
        self.wiped: list[list[str]] = []

    def wipe(self, wwns: Sequence[str]) -> None:
        self.wiped.append(list(wwns))


def _host() -> HetznerGPUHost:
    host = HetznerGPUHost(spec=HetznerGPUHostSpec(server_number=7))
    host.status.hardware = HardwareDetails(disks=[DiskInfo(wwn=w, size_bytes=10**12) for w in DISKS])
    return host


@pytest.mark.parametrize("annotation", [["0x5000c500deadbeef"], [DISKS[0], "0x5000c500deadbeef"]])
def test_unknown_wwns_fail_clearly_and_wipe_nothing(annotation: list[str]) -> None:
    shell = Shell()
    result = host_actions._wipe(_host(), shell, annotation)  # type: ignore[arg-type]
    assert result.outcome is Outcome.FAILED and result.error_type is ErrorType.PROVISIONING
    assert "0x5000c500deadbeef" in result.message and "match no disk" in result.message
    assert shell.wiped == []


@pytest.mark.parametrize(("annotation", "wiped"), [([DISKS[1]], [DISKS[1]]), (["all"], DISKS)])
def test_known_wwns_or_all_are_wiped(annotation: list[str], wiped: list[str]) -> None:
    shell = Shell()
    result = host_actions._wipe(_host(), shell, annotation)  # type: ignore[arg-type]
    assert result.outcome is Outcome.OK and shell.wiped == [wiped]
