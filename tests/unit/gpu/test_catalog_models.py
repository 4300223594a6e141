"""Catalog: model lookup by name and PCI id, the RTX PRO 6000 / H100 / H200 tables, driver minimums, data checks."""

from __future__ import annotations

import dataclasses

import pytest

from capi_gpu.gpu import catalog


def test_short_names_and_keys() -> None:
    assert list(catalog.builtin_catalog()) == ["rtx-pro-6000", "h100-80gb", "h200-141gb"]


@pytest.mark.parametrize(
    ("given", "key"),
    [
        ("rtx-pro-6000", "rtx-pro-6000"),
        ("0x2BB510DE", "rtx-pro-6000"),
        ("0x2bb5", "rtx-pro-6000"),
        ("10de:2bb5", "rtx-pro-6000"),
        ("2BB410DE", "rtx-pro-6000"),  # Max-Q, unverified but configured
        ("0x233010DE", "h100-80gb"),
        ("0x233510DE", "h200-141gb"),
    ],
)
def test_lookup_by_name_or_device_id(given: str, key: str) -> None:
    assert catalog.builtin_catalog().model(given).key == key


def test_unknown_gpu_names_the_known_ones() -> None:
    with pytest.raises(catalog.CatalogError, match=r"unknown GPU 'a100'.*rtx-pro-6000, h100-80gb, h200-141gb"):
        catalog.builtin_catalog().model("a100")


def test_device_id_with_foreign_vendor_is_rejected() -> None:
    with pytest.raises(catalog.CatalogError, match="10DE"):
        catalog.parse_pci_device_id("0x2BB51002")


def test_server_edition_is_verified_and_workstation_ids_are_not(rtx: catalog.GpuModel) -> None:
    assert rtx.device_ids == (0x2BB5,)
    assert set(rtx.unverified_device_ids) == {0x2BB1, 0x2BB4}
    assert rtx.pci_ids() == ("0x2BB510DE",)


RTX_TABLE = {
    # name: (GI profile ID, max instances, NVML placement starts, placement size, memory slices, SMs)
    "1g.24gb": (14, 4, (0, 3, 6, 9), 3, 1, 46),
    "1g.24gb+me": (21, 1, (0, 3, 6, 9), 3, 1, 46),
    "1g.24gb+gfx": (47, 4, (0, 3, 6, 9), 3, 1, 46),
    "1g.24gb+me.all": (65, 1, (0, 3, 6, 9), 3, 1, 46),
    "1g.24gb-me": (67, 4, (0, 3, 6, 9), 3, 1, 46),
    "2g.48gb": (5, 2, (0, 6), 6, 2, 94),
    "2g.48gb+gfx": (35, 2, (0, 6), 6, 2, 94),
    "2g.48gb+me.all": (64, 1, (0, 6), 6, 2, 94),
    "2g.48gb-me": (66, 2, (0, 6), 6, 2, 94),
    "4g.96gb": (0, 1, (0,), 12, 4, 188),
    "4g.96gb+gfx": (32, 1, (0,), 12, 4, 188),
}


def test_rtx_pro_6000_profile_table(rtx: catalog.GpuModel) -> None:
    got = {
        p.name: (
            p.gi_profile_id,
            p.max_instances,
            p.placement_starts,
            p.placement_size,
            p.memory_slices,
            p.multiprocessors,
        )
        for p in rtx.profiles
    }
    assert got == RTX_TABLE
    assert (rtx.memory_slices, rtx.compute_slices, rtx.placement_units) == (4, 4, 12)


def test_rtx_placements_map_to_four_memory_slices(rtx: catalog.GpuModel) -> None:
    assert [list(rtx.placement_slices(s, 3)) for s in (0, 3, 6, 9)] == [[0], [1], [2], [3]]
    assert list(rtx.placement_slices(6, 6)) == [2, 3]


def test_variants_and_compute_slices(rtx: catalog.GpuModel) -> None:
    assert rtx.profile("1g.24gb+me.all").variant is catalog.ProfileVariant.MEDIA_ALL
    assert rtx.profile("2g.48gb-me").variant is catalog.ProfileVariant.NO_MEDIA
    assert rtx.profile("4g.96gb+gfx").compute_slices == 4
    assert rtx.profile("2g.48gb").ci_profile_id == 1  # the -cgi -C sample shows CI profile ID 1 for 2g


def test_profile_lookup_accepts_display_name_and_id(rtx: catalog.GpuModel) -> None:
    assert rtx.profile("MIG 1g.24gb+gfx").gi_profile_id == 47
    assert rtx.profile("65").name == "1g.24gb+me.all"
    with pytest.raises(catalog.CatalogError, match=r"no MIG profile '3g.72gb'.*1g.24gb, 1g.24gb\+me"):
        rtx.profile("3g.72gb")


def test_hopper_tables(h100: catalog.GpuModel) -> None:
    h200 = catalog.builtin_catalog()["h200-141gb"]
    assert [(p.name, p.gi_profile_id, p.max_instances) for p in h100.profiles] == [
        ("1g.10gb", 19, 7),
        ("1g.10gb+me", 20, 1),
        ("1g.20gb", 15, 4),
        ("2g.20gb", 14, 3),
        ("3g.40gb", 9, 2),
        ("4g.40gb", 5, 1),
        ("7g.80gb", 0, 1),
    ]
    assert [(p.name, p.max_instances) for p in h200.profiles] == [
        ("1g.18gb", 7),
        ("1g.18gb+me", 1),
        ("1g.35gb", 4),
        ("2g.35gb", 3),
        ("3g.71gb", 2),
        ("4g.71gb", 1),
        ("7g.141gb", 1),
    ]
    for model in (h100, h200):
        assert (model.memory_slices, model.compute_slices, model.placement_units) == (8, 7, 8)


@pytest.mark.parametrize(
    ("key", "branch", "ok", "too_old"),
    [
        ("rtx-pro-6000", "R575", "575.57.08", "575.51.02"),
        ("h100-80gb", "R525", "535.216.01", "525.60.13"),
        ("h200-141gb", "R550", "550.90.07", "550.54.15"),
    ],
)
def test_minimum_driver(key: str, branch: str, ok: str, too_old: str) -> None:
    req = catalog.builtin_catalog()[key].min_driver
    assert req.branch == branch
    assert req.satisfied_by(ok)
    assert not req.satisfied_by(too_old)


def test_inconsistent_model_data_is_rejected(rtx: catalog.GpuModel) -> None:
    off_grid = dataclasses.replace(rtx.profiles[0], placement_starts=(0, 3, 6, 10))
    with pytest.raises(catalog.CatalogError, match="outside the grid"):
        catalog.check_model(dataclasses.replace(rtx, profiles=(off_grid, *rtx.profiles[1:])))
    wrong_size = dataclasses.replace(rtx.profiles[0], placement_size=4)
    with pytest.raises(catalog.CatalogError, match="not 1 memory slice"):
        catalog.check_model(dataclasses.replace(rtx, profiles=(wrong_size, *rtx.profiles[1:])))
    dup = dataclasses.replace(rtx.profiles[1], gi_profile_id=14)
    with pytest.raises(catalog.CatalogError, match="GI profile ID 14 is used twice"):
        catalog.check_model(dataclasses.replace(rtx, profiles=(rtx.profiles[0], dup)))
