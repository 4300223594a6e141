"""The built-in model table, transcribed from real ``nvidia-smi mig -lgip`` / ``-lgipp`` outputs.

Kept apart from :mod:`capi_gpu.gpu.catalog` so the data reads as a table and a driver-upgrade diff
(``capi-gpu layouts check-catalog``) lands in one obvious place. Each row follows ``-lgip``'s columns:
name, ID, total instances, memory GiB, SM, then DEC/ENC/JPEG/OFA/CE, plus the ``-lgipp`` placements.

* RTX PRO 6000 Blackwell Server Edition: ``-lgip``/``-lgipp`` published from a driver 610 host and
  matching GoogleCloudPlatform/container-engine-accelerators#564 and bottlerocket-kernel-kit#300
  (IDs, counts, SMs, engines). 0x2BB5 is confirmed; the Workstation (0x2BB1) and Max-Q (0x2BB4) ids
  come from third-party lspci listings and stay *unverified* (the reference says verify; so does the
  host inspection, which reads ``pci.device_id``).
* H100 80GB: ``tests/fixtures/nvidia/nvidia-smi-lgip-h100-80gb.txt`` and ``-lgipp``.
* H200 141GB: the MIG User Guide's table; SM counts for 1g.35gb/3g.71gb/4g.71gb are assumed to equal
  H100's (*verify*; override them if a host disagrees), memory values are only known for some rows.
"""

from __future__ import annotations

from capi_gpu.gpu.catalog import DriverRequirement, Engines, GpuModel, MigProfile


def _p(
    name: str,
    gi_id: int,
    total: int,
    starts: tuple[int, ...],
    size: int,
    slices: int,
    sms: int | None,
    gib: float | None,
    dec_enc_jpeg_ofa_ce: tuple[int, int, int, int, int],
) -> MigProfile:
    dec, enc, jpeg, ofa, ce = dec_enc_jpeg_ofa_ce
    return MigProfile(
        name=name,
        gi_profile_id=gi_id,
        max_instances=total,
        placement_starts=starts,
        placement_size=size,
        memory_slices=slices,
        multiprocessors=sms,
        memory_gib=gib,
        engines=Engines(decoders=dec, encoders=enc, jpeg=jpeg, ofa=ofa, copy_engines=ce),
    )


_Q = (0, 3, 6, 9)  # RTX PRO 6000: a quarter is 3 of 12 placement units
_H = (0, 6)

RTX_PRO_6000 = GpuModel(
    key="rtx-pro-6000",
    product_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
    architecture="Blackwell",
    device_ids=(0x2BB5,),
    unverified_device_ids=(0x2BB1, 0x2BB4),  # Workstation, Max-Q Workstation: *verify*
    memory_slices=4,
    compute_slices=4,
    placement_units=12,
    engines=Engines(decoders=4, encoders=4, jpeg=4, ofa=1, copy_engines=4),
    min_driver=DriverRequirement("R575", "575.51.03"),
    profiles=(
        _p("1g.24gb", 14, 4, _Q, 3, 1, 46, 23.62, (1, 1, 1, 0, 1)),
        _p("1g.24gb+me", 21, 1, _Q, 3, 1, 46, 23.62, (1, 1, 1, 1, 1)),
        _p("1g.24gb+gfx", 47, 4, _Q, 3, 1, 46, 23.62, (1, 1, 1, 0, 1)),
        _p("1g.24gb+me.all", 65, 1, _Q, 3, 1, 46, 23.62, (4, 4, 4, 1, 1)),
        _p("1g.24gb-me", 67, 4, _Q, 3, 1, 46, 23.62, (0, 0, 0, 0, 1)),
        _p("2g.48gb", 5, 2, _H, 6, 2, 94, 47.38, (2, 2, 2, 0, 2)),
        _p("2g.48gb+gfx", 35, 2, _H, 6, 2, 94, 47.38, (2, 2, 2, 0, 2)),
        _p("2g.48gb+me.all", 64, 1, _H, 6, 2, 94, 47.38, (4, 4, 4, 1, 2)),
        _p("2g.48gb-me", 66, 2, _H, 6, 2, 94, 47.38, (0, 0, 0, 0, 2)),
        _p("4g.96gb", 0, 1, (0,), 12, 4, 188, 95.12, (4, 4, 4, 1, 4)),
        _p("4g.96gb+gfx", 32, 1, (0,), 12, 4, 188, 95.12, (4, 4, 4, 1, 4)),
    ),
    balanced=(("1g.24gb", 2), ("2g.48gb", 1)),
)

_ONE = (0, 1, 2, 3, 4, 5, 6)  # Hopper: 1-slice profiles cannot start at the 8th slot

H100_80GB = GpuModel(
    key="h100-80gb",
    product_name="NVIDIA H100 80GB HBM3",
    architecture="Hopper",
    # H100 SXM5, H100 PCIe, H800 PCIe, H800 SXM5 (mig-parted's H100-80GB/H800-80GB device filter)
    device_ids=(0x2330, 0x2331, 0x2322, 0x2324),
    unverified_device_ids=(),
    memory_slices=8,
    compute_slices=7,
    placement_units=8,
    engines=Engines(decoders=7, encoders=0, jpeg=7, ofa=1, copy_engines=8),
    min_driver=DriverRequirement("R525", "525.85.12"),
    profiles=(
        _p("1g.10gb", 19, 7, _ONE, 1, 1, 16, 9.75, (1, 0, 1, 0, 1)),
        _p("1g.10gb+me", 20, 1, _ONE, 1, 1, 16, 9.75, (1, 0, 1, 1, 1)),
        _p("1g.20gb", 15, 4, (0, 2, 4, 6), 2, 2, 26, 19.62, (1, 0, 1, 0, 1)),
        _p("2g.20gb", 14, 3, (0, 2, 4), 2, 2, 32, 19.62, (2, 0, 2, 0, 2)),
        _p("3g.40gb", 9, 2, (0, 4), 4, 4, 60, 39.50, (3, 0, 3, 0, 3)),
        _p("4g.40gb", 5, 1, (0,), 4, 4, 64, 39.50, (4, 0, 4, 0, 4)),
        _p("7g.80gb", 0, 1, (0,), 8, 8, 132, 79.25, (7, 0, 7, 1, 8)),
    ),
    balanced=(("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)),
)

H200_141GB = GpuModel(
    key="h200-141gb",
    product_name="NVIDIA H200",
    architecture="Hopper",
    device_ids=(0x2335, 0x233B),  # H200 141GB SXM, H200 NVL (mig-parted's all-balanced filter)
    unverified_device_ids=(),
    memory_slices=8,
    compute_slices=7,
    placement_units=8,
    engines=Engines(decoders=7, encoders=0, jpeg=7, ofa=1, copy_engines=8),
    min_driver=DriverRequirement("R550", "550.90.07"),
    profiles=(
        _p("1g.18gb", 19, 7, _ONE, 1, 1, 16, 16.00, (1, 0, 1, 0, 1)),
        _p("1g.18gb+me", 20, 1, _ONE, 1, 1, 16, 16.00, (1, 0, 1, 1, 1)),
        _p("1g.35gb", 15, 4, (0, 2, 4, 6), 2, 2, 26, None, (1, 0, 1, 0, 1)),
        _p("2g.35gb", 14, 3, (0, 2, 4), 2, 2, 32, 32.50, (2, 0, 2, 0, 2)),
        _p("3g.71gb", 9, 2, (0, 4), 4, 4, 60, None, (3, 0, 3, 0, 3)),
        _p("4g.71gb", 5, 1, (0,), 4, 4, 64, None, (4, 0, 4, 0, 4)),
        _p("7g.141gb", 0, 1, (0,), 8, 8, 132, 140.00, (7, 0, 7, 1, 8)),
    ),
    balanced=(("1g.18gb", 2), ("2g.35gb", 1), ("3g.71gb", 1)),
)

MODELS: tuple[GpuModel, ...] = (RTX_PRO_6000, H100_80GB, H200_141GB)
