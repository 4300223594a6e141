"""Catalog check: the built-in catalog agrees with real -lgip/-lgipp outputs; every kind of difference is reported."""

from __future__ import annotations

import dataclasses

from nvidia_samples import fixture_text

from capi_gpu.gpu import catalog, catalog_check, nvidia_smi
from capi_gpu.gpu.catalog_check import DifferenceKind


def test_rtx_catalog_agrees_with_a_real_host(rtx: catalog.GpuModel) -> None:
    assert (
        catalog_check.check(
            rtx, fixture_text("nvidia-smi-lgip-rtxpro6000.txt"), fixture_text("nvidia-smi-lgipp-rtxpro6000.txt")
        )
        == []
    )


def test_h100_catalog_agrees_with_real_hosts(h100: catalog.GpuModel) -> None:
    assert (
        catalog_check.check(
            h100, fixture_text("nvidia-smi-lgip-h100-80gb.txt"), fixture_text("nvidia-smi-lgipp-h100-80gb.txt")
        )
        == []
    )
    assert catalog_check.check(h100, fixture_text("nvidia-smi-lgip-h100-sxm5-80gb-4gpu.txt")) == []


def test_wrong_model_lists_differences(rtx: catalog.GpuModel) -> None:
    diffs = catalog_check.check(rtx, fixture_text("nvidia-smi-lgip-h100-80gb.txt"))
    kinds = {d.kind for d in diffs}
    assert DifferenceKind.MISSING_ON_HOST in kinds
    assert DifferenceKind.UNKNOWN_TO_CATALOG in kinds
    assert any(d.kind is DifferenceKind.NAME and d.profile == "1g.24gb" for d in diffs)  # ID 14 is 2g.20gb on H100


def test_each_kind_of_drift_is_reported(rtx: catalog.GpuModel) -> None:
    one = rtx.profile("1g.24gb")
    drifted = dataclasses.replace(
        rtx,
        profiles=(
            dataclasses.replace(one, gi_profile_id=99, max_instances=3, multiprocessors=40),
            *(p for p in rtx.profiles if p.name not in ("1g.24gb", "4g.96gb+gfx")),
        ),
    )
    diffs = catalog_check.check(drifted, fixture_text("nvidia-smi-lgip-rtxpro6000.txt"))
    assert {(d.kind, d.profile) for d in diffs} == {
        (DifferenceKind.PROFILE_ID, "1g.24gb"),
        (DifferenceKind.INSTANCE_TOTAL, "1g.24gb"),
        (DifferenceKind.MULTIPROCESSORS, "1g.24gb"),
        (DifferenceKind.UNKNOWN_TO_CATALOG, "4g.96gb+gfx"),
    }
    assert (
        str(next(d for d in diffs if d.kind is DifferenceKind.PROFILE_ID))
        == "GPU 0 1g.24gb: profile-id: catalog 99, host 14"
    )


def test_placements_on_the_wrong_grid_are_a_difference(rtx: catalog.GpuModel) -> None:
    quarter_grid = "GPU  0 Profile ID 14 Placements: {0,1,2,3}:1\n"
    diffs = catalog_check.compare_lgipp(rtx, nvidia_smi.parse_lgipp(quarter_grid))
    assert any(d.kind is DifferenceKind.PLACEMENTS and d.host == "{0,1,2,3}:1" for d in diffs)


def test_empty_output_is_not_agreement(rtx: catalog.GpuModel) -> None:
    assert catalog_check.compare_lgip(rtx, []) != []
