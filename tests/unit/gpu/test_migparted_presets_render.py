"""mig-parted: presets against mig-parted's own config-default.yaml, rendering, and reading configs back."""

from __future__ import annotations

import pytest
import yaml
from nvidia_samples import fixture_text

from capi_gpu.gpu import catalog, layout, migparted


@pytest.mark.parametrize(
    ("key", "sample", "pci_id"),
    [
        ("rtx-pro-6000", "mig-parted-config-rtxpro6000.yaml", "0x2BB510DE"),
        ("h100-80gb", "mig-parted-config-h100-80gb.yaml", "0x233010DE"),
    ],
)
def test_presets_match_mig_parted_default_config(key: str, sample: str, pci_id: str) -> None:
    model = catalog.builtin_catalog()[key]
    theirs = migparted.configs_for_device(yaml.safe_load(fixture_text(sample)), pci_id)
    ours = migparted.presets(model)
    assert theirs, "the sample must apply to this GPU"
    for name, chosen in theirs.items():
        assert ours[name] == chosen, name


def test_rtx_presets_cover_the_reference_list(rtx: catalog.GpuModel) -> None:
    assert set(migparted.presets(rtx)) >= {
        "all-1g.24gb", "all-1g.24gb.gfx", "all-1g.24gb-me", "all-1g.24gb.me.all",
        "all-2g.48gb", "all-2g.48gb.gfx", "all-2g.48gb-me", "all-2g.48gb.me.all",
        "all-4g.96gb", "all-4g.96gb.gfx", "all-balanced",
    }  # fmt: skip
    assert migparted.presets(rtx)["all-balanced"] == layout.Layout.of({"1g.24gb": 2, "2g.48gb": 1})
    assert migparted.presets(rtx)["all-1g.24gb"] == layout.Layout.of({"1g.24gb": 4})


def test_h200_balanced_preset() -> None:
    h200 = catalog.builtin_catalog()["h200-141gb"]
    assert str(migparted.presets(h200)["all-balanced"]) == "1g.18gb=2,2g.35gb=1,3g.71gb=1"
    assert str(migparted.presets(h200)["all-7g.141gb"]) == "7g.141gb=1"


def test_device_filter_that_excludes_the_gpu_yields_nothing() -> None:
    doc = yaml.safe_load(fixture_text("mig-parted-config-rtxpro6000.yaml"))
    # A Max-Q (0x2BB4) matches every unfiltered config but not the filtered all-balanced.
    assert "all-balanced" not in migparted.configs_for_device(doc, "0x2BB410DE")


def test_render_balanced_exactly(rtx: catalog.GpuModel) -> None:
    text = migparted.render_one(rtx, "all-balanced", device_filter="0x2bb5")
    assert text == (
        "version: v1\n"
        "mig-configs:\n"
        "  all-balanced:\n"
        '    - device-filter: ["0x2BB510DE"]\n'
        "      devices: all\n"
        "      mig-enabled: true\n"
        "      mig-devices:\n"
        '        "1g.24gb": 2\n'
        '        "2g.48gb": 1\n'
    )


def test_every_preset_renders_and_reads_back(rtx: catalog.GpuModel, h100: catalog.GpuModel) -> None:
    for model in (rtx, h100):
        named = migparted.presets(model)
        doc = yaml.safe_load(migparted.render(model, {**named, "all-disabled": None, "all-enabled": layout.Layout(())}))
        assert doc["version"] == "v1"
        back = migparted.configs_for_device(doc, model.pci_ids()[0])
        assert back == {**named, "all-disabled": None, "all-enabled": layout.Layout(())}


def test_render_names_the_layout_by_key_when_not_a_preset(rtx: catalog.GpuModel) -> None:
    doc = yaml.safe_load(migparted.render_one(rtx, "1g.24gb=2,1g.24gb-me=2"))
    assert list(doc["mig-configs"]) == ["2x1g.24gb_2x1g.24gb-me"]
    assert doc["mig-configs"]["2x1g.24gb_2x1g.24gb-me"][0]["devices"] == "all"


def test_render_refuses_an_invalid_layout(rtx: catalog.GpuModel) -> None:
    with pytest.raises(layout.LayoutError, match="needs 5 memory slices"):
        migparted.render(rtx, {"bad": layout.parse_layout("2g.48gb=1,1g.24gb=3")})


@pytest.mark.parametrize("name", ["my config", "off", "Yes", "a:b"])
def test_render_refuses_names_mig_parted_cannot_hold(rtx: catalog.GpuModel, name: str) -> None:
    with pytest.raises(layout.LayoutError, match="not a plain mig-parted config name"):
        migparted.render(rtx, {name: layout.parse_layout("1g.24gb=1")})


def test_render_with_explicit_devices(rtx: catalog.GpuModel) -> None:
    doc = yaml.safe_load(migparted.render(rtx, {"one": layout.parse_layout("4g.96gb=1")}, devices=[0]))
    assert doc["mig-configs"]["one"][0]["devices"] == [0]
