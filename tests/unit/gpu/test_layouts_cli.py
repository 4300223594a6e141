"""`capi-gpu layouts`: exit codes and output of list, validate, render, devices and check-catalog."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml
from nvidia_samples import FIXTURES

from capi_gpu.cli import layouts


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="capi-gpu")
    layouts.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["layouts", *argv])
    rc: int = args.func(args)
    return rc


def test_validate_valid(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("validate", "--gpu", "rtx-pro-6000", "1g.24gb=2,2g.48gb=1") == 0
    assert "valid: 1g.24gb=2,2g.48gb=1 on rtx-pro-6000" in capsys.readouterr().out


def test_validate_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("validate", "--gpu", "0x2BB510DE", "all-balanced") == 0


def test_validate_invalid_prints_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("validate", "--gpu", "rtx-pro-6000", "2g.48gb=1,1g.24gb=3") == 1
    err = capsys.readouterr().err
    assert "needs 5 memory slices, the GPU has 4" in err
    assert "Nearest valid layouts: 1g.24gb=2,2g.48gb=1" in err


def test_unknown_gpu_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("validate", "--gpu", "a100", "1g.10gb=1") == 2
    assert "unknown GPU 'a100'" in capsys.readouterr().err


def test_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("list", "--gpu", "rtx-pro-6000", "-o", "json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["memorySlices"] == 4
    assert doc["presets"]["all-balanced"] == "1g.24gb=2,2g.48gb=1"
    assert {"name": "1g.24gb", "id": 14, "maxInstances": 4}.items() <= doc["profiles"][0].items()


def test_list_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("list", "--gpu", "h100-80gb") == 0
    out = capsys.readouterr().out
    assert "7g.80gb" in out and "all-balanced" in out


def test_render_is_mig_parted_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("render", "--gpu", "rtx-pro-6000", "1g.24gb=4", "--name", "gex131") == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["mig-configs"]["gex131"] == [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.24gb": 4}}]


def test_devices_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("devices", "--gpu", "rtx-pro-6000", "all-2g.48gb", "-o", "json") == 0
    assert [d["name"] for d in json.loads(capsys.readouterr().out)] == ["gpu-0-mig-2g48gb-5-0", "gpu-0-mig-2g48gb-5-6"]


def test_check_catalog_agrees(capsys: pytest.CaptureFixture[str]) -> None:
    lgip = str(FIXTURES / "nvidia-smi-lgip-rtxpro6000.txt")
    lgipp = str(FIXTURES / "nvidia-smi-lgipp-rtxpro6000.txt")
    assert run("check-catalog", "--gpu", "rtx-pro-6000", "--lgip", lgip, "--lgipp", lgipp) == 0
    assert "agrees" in capsys.readouterr().out


def test_check_catalog_disagrees(capsys: pytest.CaptureFixture[str]) -> None:
    lgip = str(FIXTURES / "nvidia-smi-lgip-rtxpro6000.txt")
    assert run("check-catalog", "--gpu", "h100-80gb", "--lgip", lgip) == 1
    out = capsys.readouterr().out
    assert "GPU 0 1g.10gb: missing-on-host" in out
    assert "GPU 0 1g.24gb+me.all: unknown-to-catalog" in out


def test_check_catalog_missing_or_foreign_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("check-catalog", "--gpu", "rtx-pro-6000", "--lgip", str(tmp_path / "nope")) == 2
    junk = tmp_path / "junk.txt"
    junk.write_text("hello\n")
    assert run("check-catalog", "--gpu", "rtx-pro-6000", "--lgip", str(junk)) == 2


def test_catalog_override_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    override = tmp_path / "catalog.yaml"
    override.write_text("models:\n  rtx-pro-6000:\n    deviceIds: ['0x2BB5', '0x2BB4']\n")
    assert run("list", "--gpu", "rtx-pro-6000", "--catalog", str(override), "-o", "json") == 0
    assert json.loads(capsys.readouterr().out)["deviceIds"] == ["0x2BB510DE", "0x2BB410DE"]
