"""capi_gpu.usage: measured utilization from synthetic ResourceClaims and ResourceSlices: MIG device
names to slices, the window's time weighting, whole GPUs, unknown names, admin access, other drivers
and nodes, deduplication, window parsing."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from capi_gpu import domain, usage
from capi_gpu.gpu import catalog, layout

MODEL = catalog.builtin_catalog().model("rtx-pro-6000")
NOW = datetime.datetime(2026, 10, 8, 12, 0, tzinfo=datetime.UTC)
DAY = datetime.timedelta(hours=24)
NODES = {"gpu-a", "gpu-b"}


def ago(hours: float) -> str:
    return (NOW - datetime.timedelta(hours=hours)).isoformat().replace("+00:00", "Z")


def claim(name: str, allocated_hours_ago: float | None, *results: dict[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"namespace": "ml", "name": name, "creationTimestamp": ago(48)}}
    if allocated_hours_ago is not None:
        obj["status"] = {
            "allocation": {"devices": {"results": list(results)}, "allocationTimestamp": ago(allocated_hours_ago)}
        }
    return obj


def gpu(device: str, pool: str = "gpu-a", **extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": domain.NVIDIA_DRIVER, "pool": pool, "device": device, **extra}


GATE = {"request": "gate", "driver": domain.GATE_DRIVER, "pool": "gpu-a", "device": domain.GATE_DEVICE_NAME}
ONE_G = "gpu-0-mig-1g24gb-14-0"
ONE_G_B = "gpu-0-mig-1g24gb-14-3"
TWO_G = "gpu-0-mig-2g48gb-5-6"
FOUR_G = "gpu-0-mig-4g96gb-0-0"


@pytest.mark.parametrize(
    ("device", "slices"),
    [
        (ONE_G, 1),
        (TWO_G, 2),
        (FOUR_G, 4),
        ("gpu-0-mig-1g24gb-me-21-9", 1),  # 1g.24gb+me, named by the driver's rule
        ("gpu-0-mig-1g24gb-me-67-3", 1),  # 1g.24gb-me: same name part, told apart by the GI profile ID
        ("gpu-1-mig-2g48gb-5-0", 2),
        ("gpu-0", 4),  # a whole GPU holds every slice
        ("gpu-0-mig-1g24gb-99-0", None),  # no such GI profile
        ("gpu-0-mig-2g48gb-14-0", None),  # name and GI profile ID disagree
        ("gate", None),
        ("gpu-0-mig-3g72gb-9-0", None),
    ],
)
def test_device_names_to_slices(device: str, slices: int | None) -> None:
    assert usage.device_slices(MODEL, device) == slices


def test_names_the_layout_module_predicts_are_all_understood() -> None:
    for spec in ("1g.24gb=4", "2g.48gb=2", "4g.96gb=1", "1g.24gb=2,2g.48gb=1"):
        devices = layout.expected_devices(MODEL, spec)
        assert sum(usage.device_slices(MODEL, d.name) or 0 for d in devices) == sum(d.slices for d in devices)


@pytest.mark.parametrize(
    ("claims", "slice_hours", "now_slices", "n_claims"),
    [
        ([], 0.0, 0, 0),
        ([claim("a", 6, gpu(ONE_G))], 6.0, 1, 1),  # 1 slice for 6 h
        ([claim("a", 30, gpu(ONE_G))], 24.0, 1, 1),  # allocated before the window: counted from its start
        ([claim("a", 6, gpu(TWO_G), GATE)], 12.0, 2, 1),  # the gate device holds nothing
        ([claim("a", 6, gpu(ONE_G)), claim("b", 3, gpu(ONE_G_B))], 9.0, 2, 2),
        ([claim("a", 24, gpu(FOUR_G, pool="gpu-b"))], 96.0, 4, 1),
        ([claim("a", 24, gpu("gpu-0", pool="gpu-b"))], 96.0, 4, 1),
        ([claim("pending", None)], 0.0, 0, 0),  # not allocated
        ([claim("a", 6, gpu(ONE_G, adminAccess=True))], 0.0, 0, 0),  # monitoring holds nothing
        ([claim("a", 6, gpu(ONE_G, pool="cpu-node"))], 0.0, 0, 0),  # not one of the GPU nodes
        ([claim("a", 6, {**gpu(ONE_G), "driver": "other.example.com"})], 0.0, 0, 0),
        ([claim("a", 6, gpu(ONE_G)), claim("b", 2, gpu(ONE_G))], 6.0, 1, 1),  # one device counted once, earliest
        ([claim("future", -1, gpu(ONE_G))], 0.0, 1, 1),  # clock skew: held now, no negative hours
    ],
)
def test_measured_slice_hours(claims: list[dict[str, Any]], slice_hours: float, now_slices: int, n_claims: int) -> None:
    got = usage.measure(claims, NODES, MODEL, NOW, DAY)
    assert got.slice_hours_held == pytest.approx(slice_hours)
    assert (got.slices_held_now, got.claims) == (now_slices, n_claims)
    assert got.slices_total == 8
    assert got.utilization == pytest.approx(slice_hours / (8 * 24))


def test_utilization_of_a_mixed_fleet() -> None:
    claims = [
        claim("train", 24, gpu(FOUR_G, pool="gpu-b")),  # a whole GPU all day
        claim("serve", 12, gpu(ONE_G), GATE),  # a slice half the day
        claim("bad", 1, gpu("gpu-0-mig-9g999gb-99-0")),
    ]
    got = usage.measure(claims, NODES, MODEL, NOW, DAY)
    assert got.utilization == pytest.approx((96 + 12) / 192)
    assert got.utilization_now == pytest.approx(5 / 8)
    assert got.unrecognised == ("gpu-a/gpu-0-mig-9g999gb-99-0",)


def test_claim_without_allocation_timestamp_falls_back_to_creation() -> None:
    c = claim("old", 6, gpu(ONE_G))
    del c["status"]["allocation"]["allocationTimestamp"]
    c["metadata"]["creationTimestamp"] = ago(2)
    assert usage.measure([c], NODES, MODEL, NOW, DAY).slice_hours_held == pytest.approx(2.0)


def test_gpu_nodes_come_from_nvidia_slices_only() -> None:
    slices = [
        {"spec": {"driver": domain.NVIDIA_DRIVER, "nodeName": "gpu-a", "pool": {"name": "gpu-a"}}},
        {"spec": {"driver": domain.NVIDIA_DRIVER, "nodeName": "gpu-a", "pool": {"name": "gpu-a"}}},  # 2nd slice
        {"spec": {"driver": domain.NVIDIA_DRIVER, "pool": {"name": "gpu-b"}}},
        {"spec": {"driver": domain.GATE_DRIVER, "nodeName": "gpu-c"}},
        {"spec": {}},
    ]
    assert usage.gpu_nodes(slices) == {"gpu-a", "gpu-b"}


@pytest.mark.parametrize(
    ("text", "hours"),
    [("24h", 24), ("90m", 1.5), ("7d", 168), ("1h30m", 1.5), ("1w", 168), (" 2H ", 2), ("0.5h", 0.5)],
)
def test_window_parsing(text: str, hours: float) -> None:
    assert usage.parse_window(text) == datetime.timedelta(hours=hours)


@pytest.mark.parametrize("text", ["", "24", "h", "24x", "-1h", "0h", "1h 30m"])
def test_bad_windows(text: str) -> None:
    with pytest.raises(usage.UsageError):
        usage.parse_window(text)
