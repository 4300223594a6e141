"""The gate's exact device names come from what the host's nvidia-smi reported at provisioning
(``status.migInstances``: ``-lgi`` placements and the ``-q -x`` minor), never from the plan's prediction;
unknown, partial or disagreeing records fall back to counting by profile."""

from __future__ import annotations

from typing import Any

import nvidia_slices as nv
import pytest

from capi_gpu.api.conditions import PoolReason
from capi_gpu.api.host import HetznerGPUHost, HetznerGPUHostSpec, HetznerGPUHostStatus, MigInstance
from capi_gpu.api.machine import HetznerGPUMachine, HetznerGPUMachineSpec
from capi_gpu.api.specs import GPUSpec, MigLayout
from capi_gpu.readiness import decisions, targets

NODE = "gex131-a"
WANT = ["1g.24gb", "1g.24gb", "2g.48gb"]
# What NVML may choose for the balanced layout instead of the plan's 2g@0, 1g@6, 1g@9: both 1g first.
MOVED = [("1g.24gb", 0), ("1g.24gb", 3), ("2g.48gb", 6)]


def _instances(placed: list[tuple[str, int]], minor: int | None = 0) -> list[MigInstance]:
    return [
        MigInstance(
            gpu=0,
            minor=minor,
            profile=p,
            profile_id=nv.RTX_PRO_6000[p][0],
            instance_id=n + 1,
            placement_start=s,
            placement_size=3 * nv.RTX_PRO_6000[p][1],
        )
        for n, (p, s) in enumerate(placed)
    ]


def _host(instances: list[MigInstance]) -> HetznerGPUHost:
    status = HetznerGPUHostStatus(mig_devices=WANT, mig_instances=instances)
    return HetznerGPUHost(metadata={"name": "gex-1"}, spec=HetznerGPUHostSpec(server_number=1), status=status)


@pytest.mark.parametrize(
    ("instances", "names"),
    [
        ([], None),  # an older host, a relayout, an unreadable -lgi
        (_instances(MOVED), {nv.mig_name(p, s) for p, s in MOVED}),
        (_instances(MOVED, minor=1), {nv.mig_name(p, s, minor=1) for p, s in MOVED}),
        (_instances(MOVED, minor=None), None),  # minor not reported: a name would be a guess
        (_instances(MOVED[:2]), None),  # not the layout's profiles
        (_instances([*MOVED, ("1g.24gb", 9)]), None),
    ],
    ids=["unknown", "recorded", "minor-1", "no-minor", "fewer", "more"],
)
def test_recorded_names(instances: list[MigInstance], names: set[str] | None) -> None:
    assert targets.recorded_names(_host(instances), WANT) == (None if names is None else frozenset(names))


def _pool(host: HetznerGPUHost) -> decisions.ExpectedPool:
    machine = HetznerGPUMachine(
        metadata={"name": "m"},
        spec=HetznerGPUMachineSpec(gpu=GPUSpec(layout=MigLayout(profiles={"1g.24gb": 2, "2g.48gb": 1}))),
    )
    pool = targets.expected_pool(machine, host)
    assert pool is not None
    return pool


def _slices(placed: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return [nv.nvidia_slice(NODE, nv.layout_devices(placed))]


@pytest.mark.parametrize(
    ("recorded", "published", "reason"),
    [
        (MOVED, MOVED, PoolReason.READY),  # NVML placed differently from the plan: ready all the same
        (None, MOVED, PoolReason.READY),  # names unknown: counted by profile
        (None, nv.BALANCED, PoolReason.READY),
        (MOVED, nv.BALANCED, PoolReason.LAYOUT_MISMATCH),  # the driver shows instances the host did not report
    ],
    ids=["recorded-moved", "unknown-moved", "unknown-predicted", "recorded-but-other"],
)
def test_the_gate_expects_the_recorded_names_not_the_predicted_ones(
    recorded: list[tuple[str, int]] | None, published: list[tuple[str, int]], reason: PoolReason
) -> None:
    pool = _pool(_host(_instances(recorded) if recorded else []))
    verdict = decisions.pool_verdict(_slices(published), NODE, pool)
    assert verdict.reason is reason, verdict.message
    if reason is PoolReason.LAYOUT_MISMATCH:
        assert "missing devices" in verdict.message and nv.mig_name("2g.48gb", 6) in verdict.message
