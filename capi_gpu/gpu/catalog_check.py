"""Compare the built-in catalog with what a real host's driver reports.

After a driver upgrade the profile table can change (a new profile, a renumbered ID, a different
instance limit). Layout validation trusts the catalog, so the driver-upgrade runbook runs
``capi-gpu layouts check-catalog`` with a fresh ``nvidia-smi mig -lgip`` (and optionally ``-lgipp``)
taken on the host: every difference is listed, and an empty list means the catalog still describes
the hardware. Memory sizes are not compared; they vary with driver version and ECC, which is why
everything keys on names and IDs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from capi_gpu.gpu import catalog, nvidia_smi


class DifferenceKind(StrEnum):
    MISSING_ON_HOST = "missing-on-host"
    UNKNOWN_TO_CATALOG = "unknown-to-catalog"
    NAME = "name"
    PROFILE_ID = "profile-id"
    INSTANCE_TOTAL = "instance-total"
    MULTIPROCESSORS = "multiprocessors"
    ENGINES = "engines"
    PLACEMENTS = "placements"


@dataclass(frozen=True, slots=True)
class Difference:
    kind: DifferenceKind
    profile: str
    catalog: str
    host: str
    gpu: int = 0

    def __str__(self) -> str:
        return f"GPU {self.gpu} {self.profile}: {self.kind}: catalog {self.catalog}, host {self.host}"


def _engines(row: nvidia_smi.GiProfileRow) -> catalog.Engines:
    return catalog.Engines(row.decoders, row.encoders, row.jpeg, row.ofa, row.copy_engines)


def _fmt_engines(e: catalog.Engines) -> str:
    return f"DEC {e.decoders} ENC {e.encoders} JPEG {e.jpeg} OFA {e.ofa} CE {e.copy_engines}"


def compare_lgip(model: catalog.GpuModel, rows: Sequence[nvidia_smi.GiProfileRow]) -> list[Difference]:
    """Differences between ``model`` and each GPU's block of ``-lgip`` rows."""
    if not rows:
        return [Difference(DifferenceKind.MISSING_ON_HOST, "*", f"{len(model.profiles)} profiles", "no profiles")]
    out: list[Difference] = []
    for gpu in sorted({r.gpu for r in rows}):
        out.extend(_compare_gpu(model, [r for r in rows if r.gpu == gpu], gpu))
    return out


def _compare_gpu(model: catalog.GpuModel, rows: list[nvidia_smi.GiProfileRow], gpu: int) -> list[Difference]:
    by_name = {r.name: r for r in rows}
    by_id = {r.profile_id: r for r in rows}
    out: list[Difference] = []
    for p in model.profiles:
        row = by_name.get(p.name)
        if row is None:
            other = by_id.get(p.gi_profile_id)
            if other is not None:
                out.append(
                    Difference(
                        DifferenceKind.NAME,
                        p.name,
                        f"ID {p.gi_profile_id} is {p.name}",
                        f"ID {other.profile_id} is {other.name}",
                        gpu,
                    )
                )
            else:
                out.append(Difference(DifferenceKind.MISSING_ON_HOST, p.name, f"ID {p.gi_profile_id}", "absent", gpu))
            continue
        if row.profile_id != p.gi_profile_id:
            out.append(Difference(DifferenceKind.PROFILE_ID, p.name, str(p.gi_profile_id), str(row.profile_id), gpu))
        if row.total != p.max_instances:
            out.append(Difference(DifferenceKind.INSTANCE_TOTAL, p.name, str(p.max_instances), str(row.total), gpu))
        if p.multiprocessors is not None and row.multiprocessors != p.multiprocessors:
            out.append(
                Difference(
                    DifferenceKind.MULTIPROCESSORS,
                    p.name,
                    str(p.multiprocessors),
                    str(row.multiprocessors),
                    gpu,
                )
            )
        if p.engines != catalog.NO_ENGINES and _engines(row) != p.engines:
            out.append(
                Difference(DifferenceKind.ENGINES, p.name, _fmt_engines(p.engines), _fmt_engines(_engines(row)), gpu)
            )
    known_names = {p.name for p in model.profiles}
    known_ids = {p.gi_profile_id for p in model.profiles}
    for row in rows:
        if row.name not in known_names and row.profile_id not in known_ids:
            out.append(
                Difference(
                    DifferenceKind.UNKNOWN_TO_CATALOG,
                    row.name,
                    "absent",
                    f"ID {row.profile_id}, {row.total} instances",
                    gpu,
                )
            )
    return out


def compare_lgipp(model: catalog.GpuModel, rows: Sequence[nvidia_smi.PlacementRow]) -> list[Difference]:
    """Differences in placements (NVML units) between ``model`` and ``-lgipp`` output."""
    out: list[Difference] = []
    for gpu in sorted({r.gpu for r in rows}):
        by_id = {r.profile_id: r for r in rows if r.gpu == gpu}
        for p in model.profiles:
            row = by_id.get(p.gi_profile_id)
            if row is None:
                out.append(
                    Difference(
                        DifferenceKind.MISSING_ON_HOST,
                        p.name,
                        f"placements of ID {p.gi_profile_id}",
                        "absent",
                        gpu,
                    )
                )
            elif (row.starts, row.size) != (p.placement_starts, p.placement_size):
                out.append(
                    Difference(
                        DifferenceKind.PLACEMENTS,
                        p.name,
                        _fmt_placements(p.placement_starts, p.placement_size),
                        _fmt_placements(row.starts, row.size),
                        gpu,
                    )
                )
        known = {p.gi_profile_id for p in model.profiles}
        out.extend(
            Difference(
                DifferenceKind.UNKNOWN_TO_CATALOG,
                f"ID {r.profile_id}",
                "absent",
                _fmt_placements(r.starts, r.size),
                gpu,
            )
            for r in by_id.values()
            if r.profile_id not in known
        )
    return out


def _fmt_placements(starts: Sequence[int], size: int) -> str:
    return "{" + ",".join(map(str, starts)) + f"}}:{size}"


def check(model: catalog.GpuModel, lgip_text: str, lgipp_text: str | None = None) -> list[Difference]:
    """Parse the host's outputs and compare; empty means the catalog agrees."""
    diffs = compare_lgip(model, nvidia_smi.parse_lgip(lgip_text))
    if lgipp_text is not None:
        diffs.extend(compare_lgipp(model, nvidia_smi.parse_lgipp(lgipp_text)))
    return diffs
