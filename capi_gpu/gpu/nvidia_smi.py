"""Parsers for what ``nvidia-smi`` and ``lspci -nn`` print, in their real formats.

Host inspection and the readiness checks learn the GPU's state by running these tools over SSH; the
text is the interface. The table formats change width between models and drivers (the RTX PRO 6000
``-lgip`` table is 81 columns, H100's 79, because profile names such as ``1g.24gb+me.all`` are longer),
so rows are matched by their tokens, never by column offsets. Anything that is neither a known row,
a frame line nor a known "nothing here" message raises :class:`NvidiaSmiParseError` with the line, so
a format change shows up as an error rather than as an empty list. ``-q -x`` lives in
:mod:`capi_gpu.gpu.nvidia_smi_xml`. Text in, values out: no subprocess here.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class NvidiaSmiParseError(ValueError):
    """Output that does not have the expected shape."""


class MigDisabledError(NvidiaSmiParseError):
    """``nvidia-smi mig`` said ``No MIG-enabled devices found.``"""


class MigMode(StrEnum):
    ENABLED = "Enabled"
    DISABLED = "Disabled"
    NOT_SUPPORTED = "N/A"


def parse_mig_mode(value: str) -> MigMode:
    text = value.strip().strip("[]")
    for mode in MigMode:
        if text.lower() == mode.value.lower():
            return mode
    raise NvidiaSmiParseError(f"{value!r} is not a MIG mode (Enabled, Disabled or N/A)")


_NOTHING = re.compile(r"^(No (GPU|compute) instances found: Not Found|No devices were found)$")
_MIG_DISABLED = "No MIG-enabled devices found."


def _lines(text: str) -> list[tuple[int, str]]:
    return [(n, line.rstrip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _fail(what: str, lineno: int, line: str) -> NvidiaSmiParseError:
    return NvidiaSmiParseError(f"{what}: unexpected line {lineno}: {line.strip()!r}")


def _nothing_or_disabled(line: str) -> bool:
    if line.strip() == _MIG_DISABLED:
        raise MigDisabledError(_MIG_DISABLED)
    return bool(_NOTHING.match(line.strip()))


# --- nvidia-smi -L ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigListing:
    profile: str
    device_index: int
    uuid: str


@dataclass(frozen=True, slots=True)
class GpuListing:
    index: int
    name: str
    uuid: str
    mig_devices: tuple[MigListing, ...] = ()


_L_GPU = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[^)\s]+)\)$")
_L_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)\s]+)\)$")


def parse_list(text: str) -> list[GpuListing]:
    """``nvidia-smi -L``: GPUs with their MIG devices and UUIDs."""
    gpus: list[GpuListing] = []
    for lineno, line in _lines(text):
        if m := _L_GPU.match(line):
            gpus.append(GpuListing(int(m[1]), m[2], m[3]))
        elif m := _L_MIG.match(line):
            if not gpus:
                raise _fail("nvidia-smi -L", lineno, line)
            last = gpus[-1]
            mig = MigListing(m[1], int(m[2]), m[3])
            gpus[-1] = GpuListing(last.index, last.name, last.uuid, (*last.mig_devices, mig))
        elif not _nothing_or_disabled(line):
            raise _fail("nvidia-smi -L", lineno, line)
    return gpus


# --- nvidia-smi --query-gpu=... --format=csv ---------------------------------------------------


def _field_name(header: str) -> str:
    return re.sub(r"\s*\[[^\]]*\]$", "", header.strip())


def parse_query_csv(text: str, fields: Sequence[str] | None = None) -> list[dict[str, str]]:
    """``--query-gpu=<fields> --format=csv[,noheader][,nounits]``: one dict per GPU, keyed by field.

    Without ``fields`` the first line must be the header (``memory.total [MiB]`` becomes
    ``memory.total``); with ``fields`` a header line, if present, is checked and skipped.
    """
    rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if r and any(c.strip() for c in r)]
    if not rows:
        return []
    if len(rows[0]) == 1 and _NOTHING.match(rows[0][0].strip()):
        return []
    if fields is None:
        names = [_field_name(h) for h in rows[0]]
        body = rows[1:]
    else:
        names = [f.strip() for f in fields]
        body = rows[1:] if [_field_name(h) for h in rows[0]] == names else rows
    out: list[dict[str, str]] = []
    for row in body:
        if len(row) != len(names):
            raise NvidiaSmiParseError(
                f"nvidia-smi --query-gpu: expected {len(names)} values ({', '.join(names)}), got {row!r}"
            )
        out.append({name: value.strip() for name, value in zip(names, row, strict=True)})
    return out


def parse_memory_mib(value: str) -> int:
    """``97887 MiB`` or ``97887`` (nounits) -> 97887."""
    m = re.fullmatch(r"\s*(\d+)\s*(MiB)?\s*", value)
    if m is None:
        raise NvidiaSmiParseError(f"{value!r} is not a memory size in MiB")
    return int(m[1])


@dataclass(frozen=True, slots=True)
class GpuQuery:
    """The fields host inspection asks for, typed; absent fields are None."""

    index: int | None
    name: str | None
    uuid: str | None
    pci_device_id: int | None  # 16-bit device id (0x2BB5 from "0x2BB510DE")
    driver_version: str | None
    memory_total_mib: int | None
    mig_current: MigMode | None
    mig_pending: MigMode | None


def gpu_query(row: dict[str, str]) -> GpuQuery:
    def get(key: str) -> str | None:
        value = row.get(key)
        return None if value is None or value.strip("[] ") in ("N/A", "") else value

    dev = get("pci.device_id")
    mem = get("memory.total")
    cur, pend, idx = get("mig.mode.current"), get("mig.mode.pending"), get("index")
    return GpuQuery(
        index=None if idx is None else int(idx),
        name=get("name"),
        uuid=get("uuid"),
        pci_device_id=None if dev is None else int(dev, 16) >> 16,
        driver_version=get("driver_version"),
        memory_total_mib=None if mem is None else parse_memory_mib(mem),
        mig_current=None if cur is None else parse_mig_mode(cur),
        mig_pending=None if pend is None else parse_mig_mode(pend),
    )


# --- nvidia-smi mig -lgip / -lgipp -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GiProfileRow:
    gpu: int
    name: str  # without the "MIG " prefix
    profile_id: int
    free: int
    total: int
    memory_gib: float | None
    p2p: str
    multiprocessors: int
    decoders: int
    encoders: int
    copy_engines: int
    jpeg: int
    ofa: int


_LGIP_1 = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\|$")
_LGIP_2 = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+(\d+)\s+\|$")
_FRAME = re.compile(r"^[+|][-=+|\s]*$")


def parse_lgip(text: str) -> list[GiProfileRow]:
    """``nvidia-smi mig -lgip``: the GPU-instance profile table (all GPUs in the output)."""
    rows: list[GiProfileRow] = []
    first: re.Match[str] | None = None
    for lineno, line in _lines(text):
        if _FRAME.match(line) or "GPU instance profiles:" in line or re.search(r"\|\s+GPU\s+Name", line):
            continue
        if re.search(r"Free/Total", line):
            continue
        if first is None and (m := _LGIP_1.match(line)):
            first = m
        elif first is not None and (m := _LGIP_2.match(line)):
            mem = first[6]
            rows.append(
                GiProfileRow(
                    gpu=int(first[1]),
                    name=first[2],
                    profile_id=int(first[3]),
                    free=int(first[4]),
                    total=int(first[5]),
                    memory_gib=float(mem) if re.fullmatch(r"\d+(\.\d+)?", mem) else None,
                    p2p=first[7],
                    multiprocessors=int(first[8]),
                    decoders=int(first[9]),
                    encoders=int(first[10]),
                    copy_engines=int(m[1]),
                    jpeg=int(m[2]),
                    ofa=int(m[3]),
                )
            )
            first = None
        elif not _nothing_or_disabled(line):
            raise _fail("nvidia-smi mig -lgip", lineno, line)
    if first is not None:
        raise NvidiaSmiParseError(f"nvidia-smi mig -lgip: profile {first[2]} has no second row")
    return rows


@dataclass(frozen=True, slots=True)
class PlacementRow:
    gpu: int
    profile_id: int
    starts: tuple[int, ...]
    size: int


_LGIPP = re.compile(r"^GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,\s]*)\}:(\d+)$")


def parse_lgipp(text: str) -> list[PlacementRow]:
    """``nvidia-smi mig -lgipp``: possible placements per GI profile (NVML placement units)."""
    rows: list[PlacementRow] = []
    for lineno, line in _lines(text):
        if m := _LGIPP.match(line.strip()):
            starts = tuple(int(s) for s in m[3].replace(" ", "").split(",") if s)
            rows.append(PlacementRow(int(m[1]), int(m[2]), starts, int(m[4])))
        elif not _nothing_or_disabled(line):
            raise _fail("nvidia-smi mig -lgipp", lineno, line)
    return rows


# --- nvidia-smi mig -lgi / -lci ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuInstanceRow:
    gpu: int
    profile: str
    profile_id: int
    instance_id: int
    start: int
    size: int


@dataclass(frozen=True, slots=True)
class ComputeInstanceRow:
    gpu: int
    gpu_instance_id: int
    profile: str
    profile_id: int  # the compute-instance profile ID
    instance_id: int
    start: int
    size: int


_LGI = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s+\|$")
_LCI = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s+\|$")
_TABLE_TEXT = re.compile(r"^\|\s*(GPU|Instance|ID|GPU instances:|Compute instances:|\s)[\w\s:|]*\|$")


def parse_lgi(text: str) -> list[GpuInstanceRow]:
    """``nvidia-smi mig -lgi``: existing GPU instances with their placements."""
    rows: list[GpuInstanceRow] = []
    for lineno, line in _lines(text):
        if m := _LGI.match(line):
            rows.append(GpuInstanceRow(int(m[1]), m[2], int(m[3]), int(m[4]), int(m[5]), int(m[6])))
        elif not (_FRAME.match(line) or _TABLE_TEXT.match(line) or _nothing_or_disabled(line)):
            raise _fail("nvidia-smi mig -lgi", lineno, line)
    return rows


def parse_lci(text: str) -> list[ComputeInstanceRow]:
    """``nvidia-smi mig -lci``: existing compute instances."""
    rows: list[ComputeInstanceRow] = []
    for lineno, line in _lines(text):
        if m := _LCI.match(line):
            rows.append(ComputeInstanceRow(int(m[1]), int(m[2]), m[3], int(m[4]), int(m[5]), int(m[6]), int(m[7])))
        elif not (_FRAME.match(line) or _TABLE_TEXT.match(line) or _nothing_or_disabled(line)):
            raise _fail("nvidia-smi mig -lci", lineno, line)
    return rows


# --- nvidia-smi mig -cgi ... [-C] / -dci / -dgi -----------------------------------------------


@dataclass(frozen=True, slots=True)
class MigOpResult:
    """What a create or destroy command reported: (gpu, GI id[, CI id], profile, profile id)."""

    created_gpu_instances: tuple[tuple[int, int, str, int], ...] = ()
    created_compute_instances: tuple[tuple[int, int, int, str, int], ...] = ()
    destroyed_gpu_instances: tuple[tuple[int, int], ...] = ()
    destroyed_compute_instances: tuple[tuple[int, int, int], ...] = ()
    errors: tuple[str, ...] = ()


_CGI = re.compile(
    r"^Successfully created GPU instance ID\s+(\d+) on GPU\s+(\d+) using profile MIG (\S+) \(ID\s+(\d+)\)$"
)
_CCI = re.compile(
    r"^Successfully created compute instance ID\s+(\d+) on GPU\s+(\d+) GPU instance ID\s+(\d+) "
    r"using profile MIG (\S+) \(ID\s+(\d+)\)$"
)
_DCI = re.compile(r"^Successfully destroyed compute instance ID\s+(\d+) from GPU\s+(\d+) GPU instance ID\s+(\d+)$")
_DGI = re.compile(r"^Successfully destroyed GPU instance ID\s+(\d+) from GPU\s+(\d+)$")


def parse_mig_op(text: str) -> MigOpResult:
    """Output of ``-cgi [-C]``, ``-cci``, ``-dci``, ``-dgi``; ``Unable to``/``Failed to`` lines are errors."""
    gis: list[tuple[int, int, str, int]] = []
    cis: list[tuple[int, int, int, str, int]] = []
    dgis: list[tuple[int, int]] = []
    dcis: list[tuple[int, int, int]] = []
    errors: list[str] = []
    for lineno, raw in _lines(text):
        line = raw.strip()
        if m := _CGI.match(line):
            gis.append((int(m[2]), int(m[1]), m[3], int(m[4])))
        elif m := _CCI.match(line):
            cis.append((int(m[2]), int(m[3]), int(m[1]), m[4], int(m[5])))
        elif m := _DCI.match(line):
            dcis.append((int(m[2]), int(m[3]), int(m[1])))
        elif m := _DGI.match(line):
            dgis.append((int(m[2]), int(m[1])))
        elif line.startswith(("Unable to", "Failed to")) or line == _MIG_DISABLED or _NOTHING.match(line):
            errors.append(line)
        else:
            raise _fail("nvidia-smi mig", lineno, raw)
    return MigOpResult(tuple(gis), tuple(cis), tuple(dgis), tuple(dcis), tuple(errors))


# --- lspci -nn ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PciDevice:
    address: str
    class_name: str
    class_code: int
    vendor_id: int
    device_id: int
    description: str
    revision: str | None

    @property
    def is_nvidia_gpu(self) -> bool:
        # Class 03xx: display controllers (VGA 0300, 3D 0302); the GPU's audio function is 0403.
        return self.vendor_id == 0x10DE and self.class_code >> 8 == 0x03


_HEX4 = "[0-9a-fA-F]{4}"
_LSPCI = re.compile(
    r"^(?P<addr>[0-9a-fA-F]{2,4}(?::[0-9a-fA-F]{2})?:[0-9a-fA-F]{2}\.[0-7])\s+"
    rf"(?P<cls>.+?) \[(?P<code>{_HEX4})\]: (?P<desc>.*?)\s*\[(?P<vendor>{_HEX4}):(?P<device>{_HEX4})\]"
    r"(?: \(rev (?P<rev>[0-9a-fA-F]+)\))?(?: \(prog-if [^)]*\))?$"
)


def parse_lspci(text: str) -> list[PciDevice]:
    """``lspci -nn`` (optionally ``-D``): every device line."""
    devices: list[PciDevice] = []
    for lineno, line in _lines(text):
        m = _LSPCI.match(line.strip())
        if m is None:
            raise _fail("lspci -nn", lineno, line)
        devices.append(
            PciDevice(
                address=m["addr"],
                class_name=m["cls"],
                class_code=int(m["code"], 16),
                vendor_id=int(m["vendor"], 16),
                device_id=int(m["device"], 16),
                description=m["desc"],
                revision=m["rev"],
            )
        )
    return devices


def nvidia_gpus(text: str) -> list[PciDevice]:
    """The NVIDIA display-class devices (GPUs) in ``lspci -nn`` output."""
    return [d for d in parse_lspci(text) if d.is_nvidia_gpu]
