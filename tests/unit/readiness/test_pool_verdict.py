"""Pool verdicts from NVIDIA slices: generations, slice counts, layout by profile/name, taints, host."""

from __future__ import annotations

import dataclasses
from typing import Any

import nvidia_slices as nv
import pytest

from capi_gpu.api.conditions import PoolReason
from capi_gpu.readiness import decisions

NODE = "gex131-a"
BALANCED = decisions.ExpectedPool(profiles={"1g.24gb": 2, "2g.48gb": 1})
BALANCED_NAMES = dataclasses.replace(BALANCED, device_names=frozenset(nv.mig_name(p, s) for p, s in nv.BALANCED))


def one(devices: list[dict[str, Any]], **kw: Any) -> list[dict[str, Any]]:
    return [nv.nvidia_slice(NODE, devices, **kw)]


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    slices: list[dict[str, Any]]
    expected: decisions.ExpectedPool
    reason: PoolReason
    says: tuple[str, ...] = ()


CASES = [
    Case("balanced-ready", one(nv.layout_devices(nv.BALANCED)), BALANCED, PoolReason.READY, ("1g.24gb=2",)),
    Case("names-ready", one(nv.layout_devices(nv.BALANCED)), BALANCED_NAMES, PoolReason.READY),
    Case("no-slices", [], BALANCED, PoolReason.NO_SLICES, ("no gpu.nvidia.com ResourceSlice", NODE)),
    Case(
        "other-node-only",
        [nv.nvidia_slice("gex131-b", nv.layout_devices(nv.BALANCED))],
        BALANCED,
        PoolReason.NO_SLICES,
    ),
    Case(
        "other-driver-only",
        [nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED), driver="compute-domain.nvidia.com")],
        BALANCED,
        PoolReason.NO_SLICES,
    ),
    Case(
        "one-of-two-slices",
        one(nv.layout_devices(nv.BALANCED[:2]), count=2),
        BALANCED,
        PoolReason.POOL_INCOMPLETE,
        ("1 of 2 slices",),
    ),
    Case(
        "two-slices-complete",
        [
            nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED[:2]), count=2, suffix="a"),
            nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED[2:]), count=2, suffix="b"),
        ],
        BALANCED,
        PoolReason.READY,
    ),
    Case(
        "republish-in-flight",
        [
            nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED), generation=3, suffix="old"),
            nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED[:1]), generation=4, count=2, suffix="new"),
        ],
        BALANCED,
        PoolReason.POOL_INCOMPLETE,
        ("generation 4", "1 of 2", "older generations still present"),
    ),
    Case(
        "older-generation-ignored",
        [
            nv.nvidia_slice(NODE, nv.layout_devices(nv.ALL_1G), generation=1, suffix="old"),
            nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED), generation=2, suffix="new"),
        ],
        BALANCED,
        PoolReason.READY,
    ),
    Case(
        "only-older-generation-matches",
        [
            nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED), generation=1, suffix="old"),
            nv.nvidia_slice(NODE, nv.layout_devices(nv.ALL_1G), generation=2, suffix="new"),
        ],
        BALANCED,
        PoolReason.LAYOUT_MISMATCH,
        ("missing 2g.48gb=1", "unexpected 1g.24gb=2"),
    ),
    Case(
        "disagreeing-slice-counts",
        [
            nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED[:2]), count=2, suffix="a"),
            nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED[2:]), count=3, suffix="b"),
        ],
        BALANCED,
        PoolReason.POOL_INCOMPLETE,
        ("disagree on resourceSliceCount",),
    ),
    Case(
        "missing-profile",
        one(nv.layout_devices(nv.BALANCED[:2])),
        BALANCED,
        PoolReason.LAYOUT_MISMATCH,
        ("missing 2g.48gb=1",),
    ),
    Case(
        "extra-profile-named",
        one(nv.layout_devices(nv.ALL_1G)),
        BALANCED,
        PoolReason.LAYOUT_MISMATCH,
        ("missing 2g.48gb=1", "unexpected 1g.24gb=2 (gpu-0-mig-1g24gb-14-0", "gpu-0-mig-1g24gb-14-9"),
    ),
    Case(
        "mig-off-full-gpu",
        one([nv.full_gpu_device()]),
        BALANCED,
        PoolReason.LAYOUT_MISMATCH,
        ("unexpected gpu=1 (gpu-0)", "missing 1g.24gb=2, 2g.48gb=1"),
    ),
    Case(
        "full-gpu-expected",
        one([nv.full_gpu_device()]),
        decisions.ExpectedPool(full_gpus=1),
        PoolReason.READY,
    ),
    Case(
        "same-counts-other-placement",
        one(nv.layout_devices([("2g.48gb", 6), ("1g.24gb", 0), ("1g.24gb", 3)])),
        BALANCED_NAMES,
        PoolReason.LAYOUT_MISMATCH,
        ("missing devices gpu-0-mig-1g24gb-14-6, gpu-0-mig-1g24gb-14-9, gpu-0-mig-2g48gb-5-0",),
    ),
    Case(
        "gfx-is-not-plain",
        one(nv.layout_devices([("1g.24gb+gfx", 6), ("1g.24gb", 9), ("2g.48gb", 0)])),
        BALANCED,
        PoolReason.LAYOUT_MISMATCH,
        ("missing 1g.24gb=1", "unexpected 1g.24gb+gfx=1 (gpu-0-mig-1g24gb-gfx-47-6)"),
    ),
    Case(
        "minus-me-vs-plus-me",
        one(nv.layout_devices([("1g.24gb-me", 0)])),
        decisions.ExpectedPool(profiles={"1g.24gb+me": 1}),
        PoolReason.LAYOUT_MISMATCH,
        ("missing 1g.24gb+me=1", "unexpected 1g.24gb-me=1 (gpu-0-mig-1g24gb-me-67-0)"),
    ),
    Case(
        "published-twice",
        [
            nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED), count=2, suffix="a"),
            nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED[:1]), count=2, suffix="b"),
        ],
        BALANCED,
        PoolReason.LAYOUT_MISMATCH,
        ("published more than once: gpu-0-mig-1g24gb-14-6",),
    ),
    # One bad device (an XID) is that device's problem: the node stays ready and says which (issue 15).
    Case(
        "xid-on-one-device",
        one([*nv.layout_devices(nv.BALANCED[:2]), nv.mig_device("2g.48gb", 0, taints=[nv.xid_taint(79)])]),
        BALANCED,
        PoolReason.READY,
        ("gpu-0-mig-2g48gb-5-0 (gpu.nvidia.com/xid=79:NoSchedule)", "the other devices serve"),
    ),
    Case(
        "xid-on-every-device",
        one([nv.mig_device(p, s, taints=[nv.xid_taint(79)]) for p, s in nv.BALANCED]),
        BALANCED,
        PoolReason.DEVICE_TAINTED,
        ("no usable device left", "gpu-0-mig-2g48gb-5-0 (gpu.nvidia.com/xid=79:NoSchedule)"),
    ),
    Case(
        "gpu-lost-noschedule",
        one([nv.mig_device(p, s, taints=[nv.gpu_lost_taint()]) for p, s in nv.BALANCED]),
        BALANCED,
        PoolReason.DEVICE_TAINTED,
        ("GPU lost", "gpu.nvidia.com/gpu-lost:NoSchedule"),
    ),
    Case(
        "gpu-lost-noexecute",
        one(
            [
                *nv.layout_devices(nv.BALANCED[1:]),
                nv.mig_device("1g.24gb", 6, taints=[{"key": "gpu.nvidia.com/gpu-lost", "effect": "NoExecute"}]),
            ]
        ),
        BALANCED,
        PoolReason.DEVICE_TAINTED,
        ("gpu.nvidia.com/gpu-lost:NoExecute",),
    ),
    Case(
        "effect-none-is-fine",
        one(
            [
                *nv.layout_devices(nv.BALANCED[1:]),
                nv.mig_device(
                    "1g.24gb",
                    6,
                    taints=[
                        nv.xid_taint(13, "None"),
                        {"key": "gpu.nvidia.com/unmonitored", "effect": "None"},
                    ],
                ),
            ]
        ),
        BALANCED,
        PoolReason.READY,
    ),
    Case(
        "host-disagrees",
        one(nv.layout_devices(nv.BALANCED)),
        dataclasses.replace(BALANCED, host_agrees=False, host_detail="mig.mode.pending=Enabled current=Disabled"),
        PoolReason.HOST_MISMATCH,
        ("mig.mode.pending=Enabled",),
    ),
    Case(
        "host-disagrees-and-no-slices",
        [],
        dataclasses.replace(BALANCED, host_agrees=False),
        PoolReason.HOST_MISMATCH,
        ("nvidia-smi on the host disagrees", "no gpu.nvidia.com ResourceSlice"),
    ),
    Case(
        "uuids-match-host",
        one(nv.layout_devices(nv.BALANCED, seed="boot2")),
        dataclasses.replace(BALANCED, host_mig_uuids=frozenset(nv.mig_uuid(p, s, "boot2") for p, s in nv.BALANCED)),
        PoolReason.READY,
    ),
    Case(
        "stale-after-relayout",
        one(nv.layout_devices(nv.ALL_1G, seed="boot1")),
        dataclasses.replace(BALANCED, host_mig_uuids=frozenset(nv.mig_uuid(p, s, "boot2") for p, s in nv.BALANCED)),
        PoolReason.STALE_GENERATION,
        ("restart it", "pool differs from the MIG layout"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_pool_verdict(case: Case) -> None:
    verdict = decisions.pool_verdict(case.slices, NODE, case.expected)
    assert verdict.reason is case.reason, verdict.message
    assert verdict.ready is (case.reason is PoolReason.READY)
    assert verdict.node == NODE
    for fragment in case.says:
        assert fragment in verdict.message, verdict.message


def test_every_problem_is_reported_in_priority_order() -> None:
    devices = [nv.mig_device("1g.24gb", 6, taints=[nv.gpu_lost_taint()]), *nv.layout_devices(nv.BALANCED[1:2])]
    expected = dataclasses.replace(BALANCED, host_agrees=False)
    verdict = decisions.pool_verdict(one(devices), NODE, expected)
    assert [p.reason for p in verdict.problems] == [
        PoolReason.HOST_MISMATCH,
        PoolReason.LAYOUT_MISMATCH,
        PoolReason.DEVICE_TAINTED,
    ]
    assert verdict.generation == 1


def test_long_lists_are_bounded() -> None:
    devices = [nv.mig_device("1g.24gb", 0, taints=[nv.xid_taint(i)]) | {"name": f"d{i:02}"} for i in range(20)]
    verdict = decisions.pool_verdict(one(devices), NODE, decisions.ExpectedPool(profiles={"1g.24gb": 20}))
    assert verdict.reason is PoolReason.DEVICE_TAINTED
    assert "and 12 more" in verdict.message
    assert "d19" not in verdict.message


def test_qualified_attribute_names_are_read_too() -> None:
    device = nv.mig_device("2g.48gb", 0)
    device["attributes"] = {f"gpu.nvidia.com/{k}": v for k, v in device["attributes"].items()}
    verdict = decisions.pool_verdict(one([device]), NODE, decisions.ExpectedPool(profiles={"2g.48gb": 1}))
    assert verdict.ready, verdict.message


def test_current_pools_exposes_the_newest_generation() -> None:
    slices = [
        nv.nvidia_slice(NODE, nv.layout_devices(nv.ALL_1G), generation=1, suffix="old"),
        nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED), generation=2, suffix="new"),
    ]
    (pool,) = decisions.current_pools(slices, NODE).values()
    assert (pool.name, pool.generation, pool.older_slices, pool.complete) == (NODE, 2, 1, True)
    assert set(pool.devices) == {nv.mig_name(p, s) for p, s in nv.BALANCED}
    assert pool.devices["gpu-0-mig-2g48gb-5-0"].profile == "2g.48gb"


@pytest.mark.parametrize(
    ("spec", "published"),
    [
        ("1g.24gb=2,2g.48gb=1", nv.BALANCED),
        ("1g.24gb=4", nv.ALL_1G),
        ("1g.24gb+me.all=1", [("1g.24gb+me.all", 0)]),
        ("4g.96gb+gfx=1", [("4g.96gb+gfx", 0)]),
    ],
)
def test_expected_pool_from_the_layout_matches_what_the_driver_publishes(
    spec: str, published: list[tuple[str, int]]
) -> None:
    """The layout module's device names and our NVIDIA-format fixtures agree (dra-nvidia.md §3)."""
    from capi_gpu.gpu import catalog, layout

    model = catalog.builtin_catalog()["rtx-pro-6000"]
    expected = decisions.ExpectedPool.from_devices(layout.expected_devices(model, spec))
    verdict = decisions.pool_verdict(one(nv.layout_devices(published)), NODE, expected)
    assert verdict.ready, verdict.message
    assert expected.device_names == {nv.mig_name(p, s) for p, s in published}
