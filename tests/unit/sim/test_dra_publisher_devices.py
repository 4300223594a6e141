"""The DRA publisher's device list from the GPU shim's real outputs: MIG devices named and shaped like
the NVIDIA driver's (names equal gpu.layout's expected devices, memorySlice<N> per placement unit,
semver versions), the full GPU when MIG is off, and no devices when MIG is on but empty."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from capi_gpu.gpu import catalog, layout
from capi_gpu_sim import dra_publisher

SHIM = str(resources.files("capi_gpu_sim.gpu_shim").joinpath("nvidia_smi.py"))


def smi(root: Path, *args: str) -> str:
    env = {**os.environ, "GPU_SHIM_ROOT": str(root)}
    proc = subprocess.run(
        [sys.executable, SHIM, *args], capture_output=True, text=True, env=env, timeout=30, check=False
    )
    return proc.stdout


def read(root: Path) -> tuple[dra_publisher.GpuFacts, list[dra_publisher.MigFacts]]:
    query = smi(root, f"--query-gpu={','.join(dra_publisher.QUERY_FIELDS)}", "--format=csv,noheader,nounits")
    return dra_publisher.parse_gpu(query, smi(root, "-q", "-x"), smi(root, "-L"), smi(root, "mig", "-lgi"), "NvidiaRTX")


def test_static_mig_devices_match_the_layout(tmp_path: Path) -> None:
    model = catalog.builtin_catalog().model("2bb5")
    spec = {"1g.24gb": 2, "2g.48gb": 1}
    placed = layout.validate(model, spec)
    smi(tmp_path, "-i", "0", "-mig", "1")
    smi(tmp_path, "mig", "-cgi", ",".join(f"{p.gi_profile_id}:{p.start}" for p in placed), "-C")
    gpu, migs = read(tmp_path)
    devices = dra_publisher.build_devices(gpu, migs)
    expected = layout.expected_devices(model, spec)
    assert [d["name"] for d in devices] == [e.name for e in expected]
    for dev, exp in zip(devices, expected, strict=True):
        slices = {k for k in dev["capacity"] if k.startswith("memorySlice")}
        assert slices == {f"memorySlice{i}" for i in exp.memory_slices}
        assert dev["attributes"]["parentUUID"] == {"string": gpu.uuid}
        assert dev["attributes"]["architecture"] == {"string": "Blackwell"}
        assert len(dev["attributes"]) + len(dev["capacity"]) <= 32
    assert devices[0]["attributes"]["driverVersion"]["version"] == dra_publisher.semver(gpu.driver_version)


def test_mig_off_is_the_full_gpu_and_mig_on_empty_is_nothing(tmp_path: Path) -> None:
    gpu, migs = read(tmp_path)
    (dev,) = dra_publisher.build_devices(gpu, migs)
    assert dev["name"] == "gpu-0" and dev["attributes"]["type"] == {"string": "gpu"}
    assert int(dev["capacity"]["memory"]["value"]) == gpu.memory_mib * 1024 * 1024
    smi(tmp_path, "-i", "0", "-mig", "1")
    gpu, migs = read(tmp_path)
    assert gpu.mig_enabled and dra_publisher.build_devices(gpu, migs) == []


@pytest.mark.parametrize(("raw", "want"), [("575.57.08", "575.57.8"), ("12.9", "12.9.0"), ("12.0", "12.0.0")])
def test_versions_are_semver(raw: str, want: str) -> None:
    assert dra_publisher.semver(raw) == want
