"""nvidia-smi text parsers vs real outputs: -L, --query-gpu csv, mig -lgip/-lgipp/-lgi/-lci/-cgi/-dci/-dgi, lspci."""

from __future__ import annotations

import pytest
from nvidia_samples import fixture_text

from capi_gpu.gpu import nvidia_smi


def test_list_a100_with_seven_mig_devices() -> None:
    (gpu,) = nvidia_smi.parse_list(fixture_text("nvidia-smi-L-a100-80gb-7xmig.txt"))
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.uuid == "GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16"
    assert [m.device_index for m in gpu.mig_devices] == list(range(7))
    assert {m.profile for m in gpu.mig_devices} == {"1g.10gb"}
    assert gpu.mig_devices[6].uuid == "MIG-1aae4990-b962-574e-8375-119d6d9b9687"


def test_list_rtx_pro_two_gpus() -> None:
    gpus = nvidia_smi.parse_list(fixture_text("nvidia-smi-L-rtxpro6000-4x1g.txt"))
    assert [(g.index, len(g.mig_devices)) for g in gpus] == [(0, 4), (1, 0)]
    assert gpus[0].name == "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def test_list_rejects_unknown_lines() -> None:
    with pytest.raises(nvidia_smi.NvidiaSmiParseError, match="unexpected line 1"):
        nvidia_smi.parse_list("Failed to initialize NVML: Driver/library version mismatch\n")


def test_query_csv_with_header() -> None:
    rows = nvidia_smi.parse_query_csv(fixture_text("nvidia-smi-query-index-name-mig-rtxpro6000.csv"))
    assert rows == [
        {"index": "0", "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "mig.mode.current": "Disabled"}
    ]
    q = nvidia_smi.gpu_query(rows[0])
    assert (q.index, q.mig_current, q.pci_device_id) == (0, nvidia_smi.MigMode.DISABLED, None)


def test_query_csv_noheader_eight_gpus() -> None:
    fields = ["pci.device_id", "mig.mode.current", "mig.mode.pending"]
    rows = nvidia_smi.parse_query_csv(fixture_text("nvidia-smi-query-devid-mig-noheader-rtxpro6000-8gpu.csv"), fields)
    assert len(rows) == 8
    q = nvidia_smi.gpu_query(rows[0])
    assert q.pci_device_id == 0x2BB5
    assert q.mig_pending is nvidia_smi.MigMode.DISABLED


def test_query_csv_units_and_na() -> None:
    text = "memory.total [MiB], mig.mode.current, uuid\n97887 MiB, [N/A], GPU-1\n"
    (row,) = nvidia_smi.parse_query_csv(text)
    q = nvidia_smi.gpu_query(row)
    assert (q.memory_total_mib, q.mig_current, q.uuid) == (97887, None, "GPU-1")
    assert nvidia_smi.parse_memory_mib("97887") == 97887


def test_query_csv_wrong_field_count() -> None:
    with pytest.raises(nvidia_smi.NvidiaSmiParseError, match="expected 2 values"):
        nvidia_smi.parse_query_csv("0x2BB510DE, Enabled, Enabled\n", ["pci.device_id", "mig.mode.current"])


def test_lgip_rtx_pro_6000() -> None:
    rows = nvidia_smi.parse_lgip(fixture_text("nvidia-smi-lgip-rtxpro6000.txt"))
    assert [r.profile_id for r in rows] == [14, 21, 47, 65, 67, 5, 35, 64, 66, 0, 32]
    me_all = rows[3]
    assert (me_all.name, me_all.total, me_all.multiprocessors) == ("1g.24gb+me.all", 1, 46)
    assert (me_all.decoders, me_all.encoders, me_all.copy_engines, me_all.jpeg, me_all.ofa) == (4, 4, 1, 4, 1)
    assert rows[9].memory_gib == 95.12


def test_lgip_h100_four_gpus() -> None:
    rows = nvidia_smi.parse_lgip(fixture_text("nvidia-smi-lgip-h100-sxm5-80gb-4gpu.txt"))
    assert len(rows) == 28
    assert sorted({r.gpu for r in rows}) == [0, 1, 2, 3]
    assert {(r.name, r.profile_id, r.total) for r in rows if r.gpu == 3} == {
        ("1g.10gb", 19, 7), ("1g.10gb+me", 20, 1), ("1g.20gb", 15, 4), ("2g.20gb", 14, 3),
        ("3g.40gb", 9, 2), ("4g.40gb", 5, 1), ("7g.80gb", 0, 1),
    }  # fmt: skip


def test_lgip_truncated_row() -> None:
    text = fixture_text("nvidia-smi-lgip-h100-80gb.txt").splitlines()[:6]
    with pytest.raises(nvidia_smi.NvidiaSmiParseError, match=r"1g\.10gb has no second row"):
        nvidia_smi.parse_lgip("\n".join(text))


def test_mig_disabled_message() -> None:
    with pytest.raises(nvidia_smi.MigDisabledError):
        nvidia_smi.parse_lgi("No MIG-enabled devices found.\n")


def test_lgipp_both_grids() -> None:
    rtx = nvidia_smi.parse_lgipp(fixture_text("nvidia-smi-lgipp-rtxpro6000.txt"))
    assert rtx[0] == nvidia_smi.PlacementRow(0, 14, (0, 3, 6, 9), 3)
    assert rtx[-1] == nvidia_smi.PlacementRow(0, 32, (0,), 12)
    h100 = nvidia_smi.parse_lgipp(fixture_text("nvidia-smi-lgipp-h100-80gb.txt"))
    assert [(r.profile_id, r.starts, r.size) for r in h100] == [
        (19, (0, 1, 2, 3, 4, 5, 6), 1), (20, (0, 1, 2, 3, 4, 5, 6), 1), (15, (0, 2, 4, 6), 2),
        (14, (0, 2, 4), 2), (9, (0, 4), 4), (5, (0,), 4), (0, (0,), 8),
    ]  # fmt: skip


def test_lgi_widths_differ_but_rows_parse() -> None:
    h100 = nvidia_smi.parse_lgi(fixture_text("nvidia-smi-lgi-h100-80gb-7x1g.txt"))
    assert [(r.instance_id, r.start, r.size) for r in h100] == [(7 + i, i, 1) for i in range(7)]
    rtx = nvidia_smi.parse_lgi(fixture_text("nvidia-smi-lgi-rtxpro6000-2g1g1g.txt"))
    assert [(r.profile, r.profile_id, r.instance_id, r.start, r.size) for r in rtx] == [
        ("1g.24gb", 14, 5, 6, 3), ("1g.24gb", 14, 6, 9, 3), ("2g.48gb", 5, 1, 0, 6),
    ]  # fmt: skip


def test_lgi_none_found() -> None:
    assert nvidia_smi.parse_lgi("No GPU instances found: Not Found\n") == []


def test_lgi_rejects_a_damaged_row() -> None:
    text = fixture_text("nvidia-smi-lgi-rtxpro6000-4x1g.txt").replace("0:3", "0-3")
    with pytest.raises(nvidia_smi.NvidiaSmiParseError, match="unexpected line 6"):
        nvidia_smi.parse_lgi(text)


def test_lci_h100_and_rtx() -> None:
    h100 = nvidia_smi.parse_lci(fixture_text("nvidia-smi-lci-h100-80gb-7x1g.txt"))
    assert [(r.gpu_instance_id, r.instance_id, r.profile_id, r.start, r.size) for r in h100] == [
        (gi, 0, 0, 0, 1) for gi in range(7, 14)
    ]
    rtx = nvidia_smi.parse_lci(fixture_text("nvidia-smi-lci-rtxpro6000-4x1g.txt"))
    assert [r.gpu_instance_id for r in rtx] == [3, 4, 5, 6]
    assert {r.profile for r in rtx} == {"1g.24gb"}


def test_cgi_with_compute_instances() -> None:
    res = nvidia_smi.parse_mig_op(fixture_text("nvidia-smi-cgi-C-h100-80gb-7x1g.txt"))
    assert [gi for _, gi, _, _ in res.created_gpu_instances] == [13, 11, 12, 7, 8, 9, 10]
    assert all(p == "1g.10gb" and pid == 19 for _, _, p, pid in res.created_gpu_instances)
    assert [(gi, ci, pid) for _, gi, ci, _, pid in res.created_compute_instances][:2] == [(13, 0, 0), (11, 0, 0)]
    rtx = nvidia_smi.parse_mig_op(fixture_text("nvidia-smi-cgi-C-rtxpro6000-2g1g1g.txt"))
    assert rtx.created_gpu_instances[0] == (0, 1, "2g.48gb", 5)
    assert rtx.created_compute_instances[0] == (0, 1, 0, "2g.48gb", 1)
    assert rtx.errors == ()


def test_destroy_outputs_and_refusal() -> None:
    res = nvidia_smi.parse_mig_op(fixture_text("nvidia-smi-dci-dgi-rtxpro6000-4x1g.txt"))
    assert res.destroyed_compute_instances == ((0, 3, 0), (0, 4, 0), (0, 5, 0), (0, 6, 0))
    assert res.destroyed_gpu_instances == ((0, 3), (0, 4), (0, 5), (0, 6))
    refused = nvidia_smi.parse_mig_op(fixture_text("nvidia-smi-dgi-in-use-rtxpro6000.txt"))
    assert refused.errors[0] == "Unable to destroy GPU instance ID  3 from GPU  0: In use by another client"


def test_lspci_finds_the_gpus_not_their_audio_functions() -> None:
    text = fixture_text("lspci-nn-rtxpro6000-workstation-2gpu.txt")
    assert len(nvidia_smi.parse_lspci(text)) == 5
    gpus = nvidia_smi.nvidia_gpus(text)
    assert [(g.address, g.device_id, g.class_code) for g in gpus] == [
        ("01:00.0", 0x2BB1, 0x0300),
        ("02:00.0", 0x2BB1, 0x0300),
    ]


def test_lspci_with_names_and_domain() -> None:
    line = (
        "0000:c1:00.0 3D controller [0302]: NVIDIA Corporation GB202GL "
        "[RTX PRO 6000 Blackwell Server Edition] [10de:2bb5] (rev a1)"
    )
    (gpu,) = nvidia_smi.nvidia_gpus(line)
    assert (gpu.address, gpu.device_id, gpu.revision) == ("0000:c1:00.0", 0x2BB5, "a1")
    assert gpu.description == "NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Server Edition]"


def test_lspci_rejects_non_nn_output() -> None:
    with pytest.raises(nvidia_smi.NvidiaSmiParseError, match="lspci -nn"):
        nvidia_smi.parse_lspci("01:00.0 VGA compatible controller: NVIDIA Corporation Device 2bb1 (rev a1)\n")
