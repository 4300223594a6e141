"""GPU shim: nvidia-smi / nvidia-mig-parted run as subprocesses against a temp GPU_SHIM_ROOT; formats parsed by
capi_gpu's parsers and compared with real outputs; mig-parted apply/assert/export; reboot; reset and reboot
flows; lost GPU; the embedded table equals the catalog."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from capi_gpu.gpu import catalog, layout, migparted, nvidia_smi, nvidia_smi_xml
from capi_gpu_sim import gpu_shim

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"
SMI = Path(str(gpu_shim.script("nvidia_smi")))
PARTED = Path(str(gpu_shim.script("nvidia_mig_parted")))
RTX = catalog.builtin_catalog()["rtx-pro-6000"]


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Host:
    """One simulated host's GPU: its state root, and the two tools run against it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {**os.environ, "GPU_SHIM_ROOT": str(root), "GPU_SHIM_NVIDIA_SMI": str(SMI)}

    def configure(self, **knobs: object) -> None:
        path = self.root / "var/lib/gpu-shim/config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"uuid": "GPU-11111111-2222-3333-4444-555555555555", **knobs}))

    def smi(self, *args: str, rc: int = 0) -> str:
        proc = subprocess.run(
            [sys.executable, str(SMI), *args], env=self.env, capture_output=True, text=True, timeout=30, check=False
        )
        assert proc.returncode == rc, f"nvidia-smi {' '.join(args)}: rc {proc.returncode}\n{proc.stdout}{proc.stderr}"
        return proc.stdout

    def parted(self, *args: str, rc: int = 0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, str(PARTED), *args], env=self.env, capture_output=True, text=True, timeout=60, check=False
        )
        assert proc.returncode == rc, f"mig-parted {' '.join(args)}: rc {proc.returncode}\n{proc.stdout}{proc.stderr}"
        return proc

    def reboot(self) -> None:
        for path in sorted((self.root / "run").rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()

    def mode(self) -> tuple[str, str]:
        out = self.smi("-i", "0", "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader")
        (row,) = nvidia_smi.parse_query_csv(out, ["mig.mode.current", "mig.mode.pending"])
        return row["mig.mode.current"], row["mig.mode.pending"]

    def write_config(self, spec: str, name: str | None = None) -> Path:
        path = self.root / "etc/capi-gpu/mig-parted.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(migparted.render_one(RTX, spec, name=name))
        return path


@pytest.fixture
def host(tmp_path: Path) -> Host:
    h = Host(tmp_path)
    h.configure()
    return h


def test_embedded_table_equals_the_catalog() -> None:
    shim = _module(SMI)
    rows = [
        (p.name, p.gi_profile_id, p.max_instances, p.placement_starts, p.placement_size, p.memory_slices,
         p.multiprocessors, p.memory_gib,
         (p.engines.decoders, p.engines.encoders, p.engines.jpeg, p.engines.ofa, p.engines.copy_engines))
        for p in RTX.profiles
    ]  # fmt: skip
    assert list(shim.PROFILES) == rows
    assert (shim.PLACEMENT_UNITS, shim.MEMORY_SLICES, shim.COMPUTE_SLICES) == (12, 4, 4)
    e = RTX.engines
    assert (e.decoders, e.encoders, e.jpeg, e.ofa, e.copy_engines) == shim.ENGINES
    assert shim.DEFAULTS["device_id"] == "0x2BB510DE"
    assert RTX.min_driver.satisfied_by(shim.DEFAULTS["driver_version"])


def test_fresh_gpu_reads_like_a_real_one(host: Host) -> None:
    (gpu,) = nvidia_smi.parse_list(host.smi("-L"))
    assert (gpu.name, gpu.uuid, gpu.mig_devices) == (RTX.product_name, "GPU-11111111-2222-3333-4444-555555555555", ())
    fields = "index,name,uuid,pci.device_id,driver_version,memory.total,mig.mode.current,mig.mode.pending"
    q = nvidia_smi.gpu_query(nvidia_smi.parse_query_csv(host.smi(f"--query-gpu={fields}", "--format=csv"))[0])
    assert (q.index, q.pci_device_id, q.memory_total_mib) == (0, 0x2BB5, 97887)
    assert (q.mig_current, q.mig_pending) == (nvidia_smi.MigMode.DISABLED, nvidia_smi.MigMode.DISABLED)
    with pytest.raises(nvidia_smi.MigDisabledError):
        nvidia_smi.parse_lgi(host.smi("mig", "-lgi", rc=6))
    assert "NVIDIA-SMI version  : 575.57.08" in host.smi("--version")


def test_outputs_are_byte_identical_to_a_real_rtx_pro_6000(host: Host) -> None:
    assert host.smi("-i", "0", "-mig", "1") == (FIXTURES / "nvidia-smi-mig-1-rtxpro6000.txt").read_text()
    assert host.smi("mig", "-lgip") == (FIXTURES / "nvidia-smi-lgip-rtxpro6000.txt").read_text()
    assert host.smi("mig", "-lgipp") == (FIXTURES / "nvidia-smi-lgipp-rtxpro6000.txt").read_text()
    created = host.smi("mig", "-i", "0", "-cgi", "2g.48gb,1g.24gb,1g.24gb", "-C")
    assert created == (FIXTURES / "nvidia-smi-cgi-C-rtxpro6000-2g1g1g.txt").read_text()
    assert host.smi("mig", "-lgi") == (FIXTURES / "nvidia-smi-lgi-rtxpro6000-2g1g1g.txt").read_text()
    assert host.smi("mig", "-dgi", rc=255).startswith("Unable to destroy GPU instance ID  1 from GPU  0: In use")
    host.smi("mig", "-dci")
    host.smi("mig", "-dgi")
    host.smi("mig", "-cgi", "14,14,14,14", "-C")
    assert host.smi("mig", "-lgi") == (FIXTURES / "nvidia-smi-lgi-rtxpro6000-4x1g.txt").read_text()
    assert host.smi("mig", "-lci") == (FIXTURES / "nvidia-smi-lci-rtxpro6000-4x1g.txt").read_text()
    assert (
        host.smi("mig", "-dci") + host.smi("mig", "-dgi")
        == (FIXTURES / "nvidia-smi-dci-dgi-rtxpro6000-4x1g.txt").read_text()
    )


def test_free_counts_follow_the_placement_grid(host: Host) -> None:
    host.smi("-i", "0", "-mig", "1")
    host.smi("mig", "-cgi", "14:3", "-C")  # a 1g in the first half leaves room for one 2g, at 6
    free = {r.name: r.free for r in nvidia_smi.parse_lgip(host.smi("mig", "-lgip"))}
    # +me.all would need the NVDEC the existing 1g holds; -me needs none.
    assert (free["1g.24gb"], free["2g.48gb"], free["4g.96gb"]) == (3, 1, 0)
    assert (free["1g.24gb+me.all"], free["1g.24gb-me"]) == (0, 3)
    out = host.smi("mig", "-cgi", "2g.48gb,2g.48gb", "-C", rc=255)
    result = nvidia_smi.parse_mig_op(out)
    assert [gi for _, gi, _, _ in result.created_gpu_instances] == [2]  # the first 2g stays, as on a GPU
    assert result.errors[-1] == "Failed to create GPU instances: Insufficient Resources"


def test_mig_parted_apply_creates_the_validated_placement(host: Host) -> None:
    cfg = host.write_config("all-balanced")
    host.parted("assert", "-f", str(cfg), "-c", "all-balanced", rc=1)
    host.parted("apply", "-f", str(cfg), "-c", "all-balanced")
    host.parted("assert", "-f", str(cfg), "-c", "all-balanced")
    gis = nvidia_smi.parse_lgi(host.smi("mig", "-lgi"))
    placed = layout.place(RTX, "all-balanced" and migparted.presets(RTX)["all-balanced"])
    assert sorted((g.profile, g.profile_id, g.start, g.size) for g in gis) == sorted(
        (p.profile, p.gi_profile_id, p.start, p.size) for p in placed
    )
    names = {layout.dra_device_name(0, g.profile, g.profile_id, g.start) for g in gis}
    assert names == {d.name for d in layout.expected_devices(RTX, migparted.presets(RTX)["all-balanced"])}
    (gpu,) = nvidia_smi.parse_list(host.smi("-L"))
    assert Counter(m.profile for m in gpu.mig_devices) == {"1g.24gb": 2, "2g.48gb": 1}
    report = nvidia_smi_xml.parse_query_xml(host.smi("-q", "-x"), strict=True)
    assert report.gpus[0].mig_current is nvidia_smi.MigMode.ENABLED
    assert [d.gpu_instance_id for d in report.gpus[0].mig_devices] == [1, 5, 6]
    assert report.gpus[0].minor == 0  # <minor_number>, which names the DRA devices
    exported = host.parted("export").stdout
    doc = yaml.safe_load(exported)
    assert doc["mig-configs"]["current"][0]["mig-devices"] == {"1g.24gb": 2, "2g.48gb": 1}


def test_apply_twice_leaves_the_instances_alone(host: Host) -> None:
    cfg = host.write_config("1g.24gb=4", name="four")
    host.parted("apply", "-f", str(cfg), "-c", "four")
    before = nvidia_smi.parse_list(host.smi("-L"))[0].mig_devices
    host.parted("apply", "-f", str(cfg), "-c", "four")
    assert nvidia_smi.parse_list(host.smi("-L"))[0].mig_devices == before


def test_apply_replaces_another_layout(host: Host) -> None:
    host.parted("apply", "-f", str(host.write_config("all-4g.96gb")), "-c", "all-4g.96gb")
    host.parted("apply", "-f", str(host.write_config("all-2g.48gb")), "-c", "all-2g.48gb")
    gis = nvidia_smi.parse_lgi(host.smi("mig", "-lgi"))
    assert sorted((g.profile, g.start) for g in gis) == [("2g.48gb", 0), ("2g.48gb", 6)]


def test_reboot_drops_instances_and_keeps_the_mode(host: Host) -> None:
    cfg = host.write_config("all-balanced")
    host.parted("apply", "-f", str(cfg), "-c", "all-balanced")
    uuids = {m.uuid for m in nvidia_smi.parse_list(host.smi("-L"))[0].mig_devices}
    host.reboot()
    assert nvidia_smi.parse_lgi(host.smi("mig", "-lgi", rc=6)) == []
    assert host.mode() == ("Enabled", "Enabled")
    host.parted("assert", "-f", str(cfg), "-c", "all-balanced", rc=1)
    host.parted("assert", "-f", str(cfg), "-c", "all-balanced", "--mode-only")
    host.parted("apply", "-f", str(cfg), "-c", "all-balanced")  # what the boot unit does
    again = {m.uuid for m in nvidia_smi.parse_list(host.smi("-L"))[0].mig_devices}
    assert len(again) == 3 and not again & uuids  # re-created devices get new UUIDs


def test_reset_required_flow(host: Host) -> None:
    host.configure(mig_toggle="reset")
    out = host.smi("-i", "0", "-mig", "1")
    assert "MIG mode is in pending enable state for GPU 00000000:01:00.0" in out
    assert host.mode() == ("Disabled", "Enabled")
    xml_gpu = nvidia_smi_xml.parse_query_xml(host.smi("-q", "-x"), strict=True).gpus[0]
    assert (xml_gpu.mig_current, xml_gpu.mig_pending) == (nvidia_smi.MigMode.DISABLED, nvidia_smi.MigMode.ENABLED)
    host.smi("mig", "-lgi", rc=6)
    assert "was successfully reset" in host.smi("-i", "0", "--gpu-reset")
    assert host.mode() == ("Enabled", "Enabled")


def test_mig_parted_resets_when_the_mode_is_only_pending(host: Host) -> None:
    host.configure(mig_toggle="reset")
    cfg = host.write_config("all-1g.24gb")
    host.parted("apply", "-f", str(cfg), "-c", "all-1g.24gb")
    assert host.mode() == ("Enabled", "Enabled")
    assert len(nvidia_smi.parse_lgi(host.smi("mig", "-lgi"))) == 4


def test_reset_impossible_needs_a_reboot(host: Host) -> None:
    host.configure(mig_toggle="reboot")
    cfg = host.write_config("all-1g.24gb")
    failed = host.parted("apply", "-f", str(cfg), "-c", "all-1g.24gb", rc=1)
    assert "reboot" in failed.stderr
    assert host.smi("-r", rc=3).strip() == "Resetting GPU 00000000:01:00.0 is not supported."
    assert host.mode() == ("Disabled", "Enabled")
    host.reboot()
    assert host.mode() == ("Enabled", "Enabled")
    host.parted("apply", "-f", str(cfg), "-c", "all-1g.24gb")
    host.parted("assert", "-f", str(cfg), "-c", "all-1g.24gb")


def test_disabling_mig_clears_the_instances(host: Host) -> None:
    host.parted("apply", "-f", str(host.write_config("all-balanced")), "-c", "all-balanced")
    host.smi("-i", "0", "-mig", "0", rc=255)  # refused while instances exist
    cfg = host.root / "off.yaml"
    cfg.write_text(migparted.render(RTX, {"all-disabled": None}))
    host.parted("apply", "-f", str(cfg), "-c", "all-disabled")
    assert host.mode() == ("Disabled", "Disabled")
    host.parted("assert", "-f", str(cfg), "-c", "all-disabled")


def test_lost_gpu(host: Host) -> None:
    host.configure(lost=True)
    message = (
        "Unable to determine the device handle for GPU0000:01:00.0: GPU is lost.  Reboot the system to recover this GPU"
    )
    assert host.smi("-L", rc=15).strip() == message
    assert host.smi("--query-gpu=mig.mode.current", "--format=csv", rc=15).strip() == message
    assert host.smi("mig", "-lgi", rc=15).strip() == message
    assert (
        "GPU is lost"
        in host.parted("apply", "-f", str(host.write_config("all-balanced")), "-c", "all-balanced", rc=1).stderr
    )


def test_fallen_off_the_bus_until_reboot(host: Host) -> None:
    host.smi("-L")
    (host.root / "run/gpu-shim/lost").touch()
    host.smi("-L", rc=15)
    host.reboot()
    host.smi("-L")


def test_device_filter_for_another_edition_does_nothing(host: Host) -> None:
    host.configure(device_id="0x2BB410DE")  # a Max-Q: mig-parted's all-balanced is filtered to 0x2BB5
    cfg = host.root / "default.yaml"
    cfg.write_text((FIXTURES / "mig-parted-config-rtxpro6000.yaml").read_text())
    host.parted("apply", "-f", str(cfg), "-c", "all-balanced")
    assert host.mode() == ("Disabled", "Disabled")
    host.parted("apply", "-f", str(cfg), "-c", "all-2g.48gb")  # unfiltered: applies
    assert len(nvidia_smi.parse_lgi(host.smi("mig", "-lgi"))) == 2


def test_argument_errors(host: Host) -> None:
    assert host.smi("--query-gpu=bogus", "--format=csv", rc=2).startswith('Field "bogus" is not a valid field')
    assert host.smi("-i", "1", "-L", rc=6).strip() == "No devices were found"
    assert "Invalid combination of input arguments" in host.smi("--frobnicate", rc=2)
    host.parted("apply", "-f", str(host.write_config("all-balanced")), "-c", "missing", rc=1)


def test_config_reader_matches_yaml_on_real_and_rendered_configs() -> None:
    parted = _module(PARTED)
    texts = [
        (FIXTURES / f).read_text() for f in ("mig-parted-config-rtxpro6000.yaml", "mig-parted-config-h100-80gb.yaml")
    ]
    texts.append(migparted.render(RTX, {**migparted.presets(RTX), "none": None}, device_filter=["0x2BB5", "0x2BB4"]))
    texts.append(
        "version: v1\nmig-configs:\n  a:\n  - devices: [0]\n    mig-enabled: true\n    mig-devices: {1g.24gb: 2}\n"
    )
    texts.append(json.dumps({"version": "v1", "mig-configs": {"j": [{"devices": "all", "mig-enabled": False}]}}))
    for text in texts:
        assert parted.load_config(text) == yaml.safe_load(text)


def test_config_reader_refuses_what_it_cannot_read() -> None:
    parted = _module(PARTED)
    with pytest.raises(parted.PartedError, match="unsupported YAML construct"):
        parted.load_config("version: v1\nmig-configs: &a\n  x: *a\n")


def test_instances_nvml_placed_elsewhere_name_the_devices_the_gate_then_expects(host: Host) -> None:
    """The chain the gate relies on, with the shim placing like NVML may (last free slot, minor 1): the host's
    readout (``provisioning.mig_readout``, what the Configure step records) names exactly the devices the
    DRA plugin stand-in publishes from the same GPU, which are not the plan's predicted names."""
    from capi_gpu.api.host import HetznerGPUHost, HetznerGPUHostSpec, HetznerGPUHostStatus
    from capi_gpu.provisioning import mig_readout
    from capi_gpu.readiness import targets
    from capi_gpu_sim import dra_publisher

    host.configure(placement="last-free", minor_number=1)
    cfg = host.write_config("all-balanced")
    host.parted("apply", "-f", str(cfg), "-c", "all-balanced")
    listing, xml, lgi = host.smi("-L"), host.smi("-q", "-x"), host.smi("mig", "-lgi")
    profiles = mig_readout.profiles(listing)
    instances = mig_readout.instances(xml, lgi, profiles)
    status = HetznerGPUHostStatus(mig_devices=profiles, mig_instances=instances)
    recorded = targets.recorded_names(
        HetznerGPUHost(metadata={}, spec=HetznerGPUHostSpec(server_number=1), status=status), profiles
    )
    query = host.smi("--query-gpu=" + ",".join(dra_publisher.QUERY_FIELDS), "--format=csv,noheader,nounits")
    gpu, migs = dra_publisher.parse_gpu(query, xml, listing, lgi, "Nvidia")
    published = {d["name"] for d in dra_publisher.build_devices(gpu, migs)}
    predicted = {d.name for d in layout.expected_devices(RTX, migparted.presets(RTX)["all-balanced"], minor=1)}
    assert recorded == published and published != predicted, (recorded, published, predicted)
    assert all(n.startswith("gpu-1-mig-") for n in published)
