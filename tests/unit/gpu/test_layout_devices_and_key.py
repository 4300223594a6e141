"""Expected DRA devices (names as the NVIDIA driver builds them, memorySlice indices) and the layout label key."""

from __future__ import annotations

import re

import pytest

from capi_gpu.gpu import catalog, layout


@pytest.mark.parametrize(
    ("profile", "gi", "start", "name"),
    [
        ("1g.24gb", 14, 0, "gpu-0-mig-1g24gb-14-0"),
        ("1g.24gb+gfx", 47, 0, "gpu-0-mig-1g24gb-gfx-47-0"),
        ("1g.24gb+me.all", 65, 9, "gpu-0-mig-1g24gb-meall-65-9"),
        ("1g.24gb-me", 67, 3, "gpu-0-mig-1g24gb-me-67-3"),
        ("4g.96gb", 0, 0, "gpu-0-mig-4g96gb-0-0"),
    ],
)
def test_dra_device_names(profile: str, gi: int, start: int, name: str) -> None:
    assert layout.dra_device_name(0, profile, gi, start) == name


def test_expected_devices_of_all_1g(rtx: catalog.GpuModel) -> None:
    devices = layout.expected_devices(rtx, {"1g.24gb": 4})
    assert [d.name for d in devices] == [f"gpu-0-mig-1g24gb-14-{s}" for s in (0, 3, 6, 9)]
    assert [d.memory_slices for d in devices] == [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)]
    assert {d.slices for d in devices} == {1}


def test_expected_devices_of_balanced_on_gpu_1(rtx: catalog.GpuModel) -> None:
    devices = layout.expected_devices(rtx, "1g.24gb=2,2g.48gb=1", minor=1)
    assert [(d.name, d.profile, d.slices) for d in devices] == [
        ("gpu-1-mig-2g48gb-5-0", "2g.48gb", 2),
        ("gpu-1-mig-1g24gb-14-6", "1g.24gb", 1),
        ("gpu-1-mig-1g24gb-14-9", "1g.24gb", 1),
    ]


def test_expected_devices_of_an_invalid_layout_raise(rtx: catalog.GpuModel) -> None:
    with pytest.raises(layout.LayoutError):
        layout.expected_devices(rtx, "2g.48gb=1,1g.24gb=3")


_LABEL = re.compile(r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ("1g.24gb=2,2g.48gb=1", "2x1g.24gb_1x2g.48gb"),
        ("2g.48gb=1,1g.24gb=2", "2x1g.24gb_1x2g.48gb"),
        ("1g.24gb+me=1,1g.24gb=3", "3x1g.24gb_1x1g.24gb.me"),
        ("1g.24gb-me=4", "4x1g.24gb-me"),
        ({}, "none"),
    ],
)
def test_layout_key(spec: str | dict[str, int], key: str) -> None:
    assert layout.layout_key(spec) == key
    assert _LABEL.match(key)


def test_plus_and_minus_media_variants_get_distinct_keys() -> None:
    assert layout.layout_key("1g.24gb+me=1") != layout.layout_key("1g.24gb-me=1")


def test_long_layout_keys_are_cut_with_a_hash() -> None:
    names = ["1g.24gb", "1g.24gb+me", "1g.24gb+gfx", "1g.24gb+me.all", "1g.24gb-me", "2g.48gb+me.all", "2g.48gb-me"]
    a = layout.layout_key(dict.fromkeys(names, 1))
    b = layout.layout_key({**dict.fromkeys(names, 1), "2g.48gb-me": 2})
    assert len(a) <= 63 and len(b) <= 63
    assert _LABEL.match(a) and _LABEL.match(b)
    assert a != b
