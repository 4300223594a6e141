"""nvidia-smi -q -x: the malformed published sample (repaired, or refused in strict mode) and a well-formed document."""

from __future__ import annotations

import pytest
from nvidia_samples import fixture_text

from capi_gpu.gpu import nvidia_smi, nvidia_smi_xml

SAMPLE = "nvidia-smi-q-x-mig-excerpt-h100.xml"


def test_strict_mode_refuses_the_malformed_sample_with_position() -> None:
    with pytest.raises(nvidia_smi.NvidiaSmiParseError, match=r"not well-formed XML \(mismatched tag: line 44"):
        nvidia_smi_xml.parse_query_xml(fixture_text(SAMPLE), strict=True)


def test_default_mode_repairs_the_sample_and_says_so() -> None:
    report = nvidia_smi_xml.parse_query_xml(fixture_text(SAMPLE))
    assert report.repaired
    assert report.repair_reason is not None and "mismatched tag" in report.repair_reason
    assert (report.driver_version, report.cuda_version) == ("575.57.08", "12.9")
    (gpu,) = report.gpus
    assert gpu.bus_id == "00000000:00:09.0"
    assert (gpu.mig_current, gpu.mig_pending) == (nvidia_smi.MigMode.ENABLED, nvidia_smi.MigMode.ENABLED)
    (dev,) = gpu.mig_devices
    assert (dev.index, dev.gpu_instance_id, dev.compute_instance_id) == (0, 1, 0)
    assert (dev.multiprocessors, dev.copy_engines, dev.decoders, dev.jpeg, dev.memory_total_mib) == (60, 3, 3, 3, 40448)


WELL_FORMED = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
  <driver_version>575.57.08</driver_version>
  <cuda_version>12.9</cuda_version>
  <gpu id="00000000:01:00.0">
    <product_name>NVIDIA RTX PRO 6000 Blackwell Server Edition</product_name>
    <uuid>GPU-8b89b58e-b427-108d-ac50-06138d78fe78</uuid>
    <mig_mode><current_mig>Disabled</current_mig><pending_mig>Enabled</pending_mig></mig_mode>
    <mig_devices>None</mig_devices>
    <pci><pci_device_id>2BB510DE</pci_device_id></pci>
  </gpu>
</nvidia_smi_log>
"""


def test_well_formed_document_with_pending_enable() -> None:
    report = nvidia_smi_xml.parse_query_xml(WELL_FORMED, strict=True)
    assert not report.repaired
    (gpu,) = report.gpus
    assert gpu.pci_device_id == 0x2BB5
    assert (gpu.mig_current, gpu.mig_pending) == (nvidia_smi.MigMode.DISABLED, nvidia_smi.MigMode.ENABLED)
    assert gpu.mig_devices == ()


def test_a_document_beyond_repair() -> None:
    with pytest.raises(nvidia_smi.NvidiaSmiParseError, match="repairing the tags failed too"):
        nvidia_smi_xml.parse_query_xml("<nvidia_smi_log><gpu id='x'>&bogus;</gpu></nvidia_smi_log>")


def test_not_an_nvidia_smi_document() -> None:
    with pytest.raises(nvidia_smi.NvidiaSmiParseError, match="not <nvidia_smi_log>"):
        nvidia_smi_xml.parse_query_xml("<html></html>")
