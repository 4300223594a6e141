#!/usr/bin/python3
"""A stand-in ``nvidia-smi`` for one simulated RTX PRO 6000 Blackwell 96 GB.

Simulated GEX131 hosts have no GPU, yet the real playbooks, the readiness checks and the NVIDIA DRA
driver's prestart all drive ``nvidia-smi``. This script gives them the real command line and the real
output formats (the tables are byte-for-byte those of a published RTX PRO 6000 host), backed by a small
state machine with the MIG rules that matter: 4 memory slices on a 12-unit placement grid, the real
profile IDs, placements and instance limits, MIG mode ``current``/``pending``, and GPU instances that
vanish at reboot. It is installed as ``/usr/bin/nvidia-smi`` inside each host's root filesystem, so it
is standalone: Python 3.11 stdlib only, no ``capi_gpu`` imports, and one file (hence longer than the
project's usual module). A unit test checks that the embedded
profile table equals ``capi_gpu.gpu.catalog``'s.

State (all under ``$GPU_SHIM_ROOT``, default ``/``):

* ``/var/lib/gpu-shim/config.json`` (knobs, persistent): ``device_id`` (``0x2BB510DE``), ``uuid``,
  ``name``, ``bus_id``, ``driver_version``, ``cuda_version``, ``memory_total_mib``, ``serial``,
  ``mig_toggle`` = ``resetless`` (mode flips at once) | ``reset`` (pending until ``nvidia-smi -r``) |
  ``reboot`` (pending, and the reset fails: only a reboot applies it), ``lost`` (GPU fell off the bus).
* ``/var/lib/gpu-shim/mig-mode.json``: MIG mode ``current``/``pending`` (persists across reboots) and
  the counter that makes re-created MIG devices get new UUIDs.
* ``/run/gpu-shim/state.json``: GPU and compute instances. ``/run`` is a fresh tmpfs every boot, so
  they vanish; the first call of a boot (no ``/run/gpu-shim``) also applies a pending mode, as loading
  the driver does. ``/run/gpu-shim/lost`` makes the GPU lost until the next reboot.
* ``/var/lib/gpu-shim/hold`` (a test's knob): while it exists, every call waits (at most ``HOLD_MAX_S``),
  standing in for a step that takes minutes on a real server (a DKMS build), so a test can catch the
  playbook mid-run and, say, move the host to another management cluster meanwhile.

CLI: ``-L``; ``--query-gpu=F,... --format=csv[,noheader][,nounits]``; ``-q [-x]``; ``-i 0 -mig 0|1``;
``-r``/``--gpu-reset``; ``--version``; ``mig -lgip|-lgipp|-lgi|-lci``; ``mig -cgi <ids|names>[:start]
[-C]``; ``mig -cci [-gi ids]``; ``mig -dci [-gi ids]``; ``mig -dgi [-gi ids]``. Exit codes follow
nvidia-smi(1): 2 bad argument, 3 not supported, 6 not found, 15 GPU lost, 255 other (in use,
insufficient resources).
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import socket
import sys
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any

# name, GI profile ID, max instances, placement starts, placement size (units), memory slices, SMs,
# memory GiB, (NVDEC, NVENC, NVJPG, OFA, copy engines) -- `nvidia-smi mig -lgip` / `-lgipp` order.
Row = tuple[str, int, int, tuple[int, ...], int, int, int, float, tuple[int, int, int, int, int]]
_Q, _H = (0, 3, 6, 9), (0, 6)
PROFILES: tuple[Row, ...] = (
    ("1g.24gb", 14, 4, _Q, 3, 1, 46, 23.62, (1, 1, 1, 0, 1)),
    ("1g.24gb+me", 21, 1, _Q, 3, 1, 46, 23.62, (1, 1, 1, 1, 1)),
    ("1g.24gb+gfx", 47, 4, _Q, 3, 1, 46, 23.62, (1, 1, 1, 0, 1)),
    ("1g.24gb+me.all", 65, 1, _Q, 3, 1, 46, 23.62, (4, 4, 4, 1, 1)),
    ("1g.24gb-me", 67, 4, _Q, 3, 1, 46, 23.62, (0, 0, 0, 0, 1)),
    ("2g.48gb", 5, 2, _H, 6, 2, 94, 47.38, (2, 2, 2, 0, 2)),
    ("2g.48gb+gfx", 35, 2, _H, 6, 2, 94, 47.38, (2, 2, 2, 0, 2)),
    ("2g.48gb+me.all", 64, 1, _H, 6, 2, 94, 47.38, (4, 4, 4, 1, 2)),
    ("2g.48gb-me", 66, 2, _H, 6, 2, 94, 47.38, (0, 0, 0, 0, 2)),
    ("4g.96gb", 0, 1, (0,), 12, 4, 188, 95.12, (4, 4, 4, 1, 4)),
    ("4g.96gb+gfx", 32, 1, (0,), 12, 4, 188, 95.12, (4, 4, 4, 1, 4)),
)
PLACEMENT_UNITS, MEMORY_SLICES, COMPUTE_SLICES = 12, 4, 4
ENGINES = (4, 4, 4, 1, 4)
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
DEFAULTS: dict[str, Any] = {
    "device_id": "0x2BB510DE",
    "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "bus_id": "00000000:01:00.0",
    "driver_version": "575.57.08",
    "cuda_version": "12.9",
    "memory_total_mib": 97887,
    "serial": "1655025000001",
    "minor_number": 0,
    "placement": "first-free",  # /dev/nvidia<minor>; the DRA driver names devices after it, not after the index
    "vbios_version": "98.02.55.00.01",
    "mig_toggle": "resetless",
    "lost": False,
}
# GI IDs are fixed by the slot (size, start): larger slots first, as the published outputs show
# (4g@0 -> 0, 2g@0 -> 1, 2g@6 -> 2, 1g@0..9 -> 3..6).
SLOTS = sorted({(r[4], s) for r in PROFILES for s in r[3]}, key=lambda t: (-t[0], t[1]))


class ShimError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def compute_slices(name: str) -> int:
    return int(name.split("g.", 1)[0])


def profile_row(ref: str) -> Row:
    wanted = ref.strip().removeprefix("MIG ").lower()
    for row in PROFILES:
        if row[0] == wanted or (wanted.isdigit() and row[1] == int(wanted)):
            return row
    raise ShimError(f"Unable to create a GPU instance on GPU  0 using profile {ref}: Invalid Argument", 2)


class Gpu:
    """The simulated GPU's state, loaded from and saved to the state files."""

    def __init__(self, root: Path) -> None:
        self.lib, self.run = root / "var/lib/gpu-shim", root / "run/gpu-shim"
        self.persistenced_pid = root / "run/nvidia-persistenced/nvidia-persistenced.pid"
        self.config: dict[str, Any] = {**DEFAULTS, **_load(self.lib / "config.json", {})}
        if "uuid" not in self.config:
            seed = f"gpu-shim/{socket.gethostname()}"
            self.config["uuid"] = f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, seed)}"
        self.mode: dict[str, Any] = _load(self.lib / "mig-mode.json", {"current": "Disabled", "pending": "Disabled"})
        if not self.run.is_dir():  # first call of this boot: the driver applies a pending mode at load
            self.run.mkdir(parents=True, exist_ok=True)
            self.mode["current"] = self.mode["pending"]
            self.save_mode()
        self.state: dict[str, Any] = _load(self.run / "state.json", {"instances": []})

    @property
    def bus_id(self) -> str:
        return str(self.config["bus_id"])

    def check_alive(self) -> None:
        if self.config["lost"] or (self.run / "lost").exists():
            raise ShimError(
                f"Unable to determine the device handle for GPU{self.bus_id[-12:]}: GPU is lost.  "
                "Reboot the system to recover this GPU",
                15,
            )

    def save_mode(self) -> None:
        _dump(self.lib / "mig-mode.json", self.mode)

    def save(self) -> None:
        _dump(self.run / "state.json", self.state)

    @property
    def instances(self) -> list[dict[str, Any]]:
        return list(self.state["instances"])

    def mig_enabled(self) -> bool:
        return bool(self.mode["current"] == "Enabled")

    def require_mig(self) -> None:
        if not self.mig_enabled():
            raise ShimError("No MIG-enabled devices found.", 6)

    def used_mask(self) -> int:
        mask = 0
        for gi in self.instances:
            mask |= ((1 << gi["size"]) - 1) << gi["start"]
        return mask

    def fits(self, extra: list[Row]) -> bool:
        """Whether ``extra`` instances can be added to the current ones (counts, budgets, placements)."""
        rows = [profile_row(gi["profile"]) for gi in self.instances] + extra
        for row in PROFILES:
            if sum(1 for r in rows if r is row) > row[2]:
                return False
        if sum(compute_slices(r[0]) for r in rows) > COMPUTE_SLICES:
            return False
        if any(sum(r[8][k] for r in rows) > ENGINES[k] for k in range(5)):
            return False
        return _place(sorted(extra, key=lambda r: -r[4]), self.used_mask()) is not None

    def free_count(self, row: Row) -> int:
        return max((k for k in range(row[2] + 1) if self.fits([row] * k)), default=0)

    def create_gi(self, row: Row, start: int | None) -> dict[str, Any]:
        if not self.fits([row]):
            raise ShimError("Insufficient Resources", 255)
        used = self.used_mask()
        # NVML picks a free placement itself and need not pick the one a plan predicts: knob "placement":
        # "last-free" takes the last free start instead of the first, so tests can see the names differ.
        order = tuple(reversed(row[3])) if self.config.get("placement") == "last-free" else row[3]
        starts = order if start is None else (start,)
        for s in starts:
            mask = ((1 << row[4]) - 1) << s
            if s in row[3] and not used & mask:
                gi = {"gi": SLOTS.index((row[4], s)), "profile": row[0], "start": s, "size": row[4], "cis": []}
                self.state["instances"] = sorted([*self.instances, gi], key=lambda g: g["gi"])
                return gi
        raise ShimError("Insufficient Resources", 255)

    def create_ci(self, gi: dict[str, Any]) -> dict[str, Any]:
        if gi["cis"]:
            raise ShimError("Insufficient Resources", 255)
        # A MIG UUID changes whenever the device is re-created, across reboots too: the counter persists.
        self.mode["generation"] = int(self.mode.get("generation", 0)) + 1
        self.save_mode()
        seed = f"{self.config['uuid']}/{gi['gi']}/0/{self.mode['generation']}"
        ci = {"ci": 0, "uuid": f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, seed)}"}
        gi["cis"].append(ci)
        return ci

    def set_mode(self, enabled: bool) -> list[str]:
        target, word = ("Enabled", "enable") if enabled else ("Disabled", "disable")
        if self.instances and self.mode["current"] != target:
            raise ShimError(f"Unable to {word} MIG Mode for GPU {self.bus_id}: In use by another client", 255)
        self.mode["pending"] = target
        out = []
        if self.config["mig_toggle"] == "resetless" or self.mode["current"] == target:
            self.mode["current"] = target
            out.append(f"{target} MIG Mode for GPU {self.bus_id}")
        else:
            out += [
                f"Warning: MIG mode is in pending {word} state for GPU {self.bus_id}:Not Supported",
                f"Reboot the system or try nvidia-smi --gpu-reset to make MIG mode effective on GPU {self.bus_id}",
            ]
        self.save_mode()
        if not persistence_enabled(self):
            out += [
                "",
                f"Warning: persistence mode is disabled on device {self.bus_id}. See the Known Issues section of "
                "the nvidia-smi(1) man page for more information. Run with [--help | -h] switch to get more "
                "information on how to enable persistence mode.",
            ]
        return [*out, "All done."]

    def reset(self) -> list[str]:
        if self.config["mig_toggle"] == "reboot":
            raise ShimError(f"Resetting GPU {self.bus_id} is not supported.", 3)
        if self.instances:
            raise ShimError(
                f"Unable to reset GPU {self.bus_id} because it's being used by some other process "
                "(e.g. CUDA application, graphics application like X server, monitoring application like "
                "other instance of nvidia-smi). Please first kill all processes using this GPU and all "
                "compute applications running in the system.",
                255,
            )
        self.mode["current"] = self.mode["pending"]
        self.save_mode()
        return [f"GPU {self.bus_id} was successfully reset.", "All done."]


def _place(rows: list[Row], used: int) -> list[int] | None:
    if not rows:
        return []
    head, *rest = rows
    for s in head[3]:
        mask = ((1 << head[4]) - 1) << s
        if not used & mask and (tail := _place(rest, used | mask)) is not None:
            return [s, *tail]
    return None


def _load(path: Path, default: dict[str, Any]) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text())
    except FileNotFoundError:
        return copy.deepcopy(default)
    if not isinstance(loaded, dict):
        raise ShimError(f"gpu-shim: {path} is not a JSON object", 255)
    return loaded


def _dump(path: Path, value: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
    tmp.replace(path)


# --- output formats --------------------------------------------------------------------------------


def mig_devices(gpu: Gpu) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(gi, ci) for gi in gpu.instances for ci in gi["cis"]]


def list_gpus(gpu: Gpu) -> list[str]:
    out = [f"GPU 0: {gpu.config['name']} (UUID: {gpu.config['uuid']})"]
    for n, (gi, ci) in enumerate(mig_devices(gpu)):
        out.append(f"  MIG {gi['profile']:<11} Device {n:>2}: (UUID: {ci['uuid']})")
    return out


def lgip(gpu: Gpu) -> list[str]:
    bar = "+" + "-" * 79 + "+"
    out = [
        bar,
        "| GPU instance profiles:" + " " * 56 + "|",
        "| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |",
        "|                                Free/Total   GiB              CE    JPEG  OFA  |",
        "|" + "=" * 79 + "|",
    ]
    for row in PROFILES:
        name, pid, total, _s, _z, _m, sms, gib, (dec, enc, jpeg, ofa, ce) = row
        free = gpu.free_count(row) if gpu.mig_enabled() else total
        out.append(
            f"|{0:>4}  {'MIG ' + name:<18}{pid:>4}{f'{free}/{total}':>8}{gib:>13.2f}{'No':>8}     "
            f"{sms:<3}    {dec:<1}     {enc:<1}   |"
        )
        out.append("|" + " " * 63 + f"{ce:<1}     {jpeg:<1}     {ofa:<1}   |")
        out.append(bar)
    return out


def lgipp(_gpu: Gpu) -> list[str]:
    out = []
    for name, pid, _t, starts, size, *_ in PROFILES:
        label = "Placements:" if len(starts) > 1 else "Placement :"
        out.append(f"GPU {0:>2} Profile ID {pid:>2} {label} {{{','.join(map(str, starts))}}}:{size}")
        del name
    return out


def lgi(gpu: Gpu) -> list[str]:
    if not gpu.instances:
        raise ShimError("No GPU instances found: Not Found", 6)
    bar = "+" + "-" * 57 + "+"
    out = [
        bar,
        "| GPU instances:" + " " * 42 + "|",
        "| GPU   Name               Profile  Instance   Placement  |",
        "|                            ID       ID       Start:Size |",
        "|" + "=" * 57 + "|",
    ]
    order = [r[0] for r in PROFILES]
    for gi in sorted(gpu.instances, key=lambda g: (order.index(g["profile"]), g["gi"])):
        pid = profile_row(gi["profile"])[1]
        out.append(f"|{0:>4}  {'MIG ' + gi['profile']:<18}{pid:>6}{gi['gi']:>9}{gi['start']:>11}:{gi['size']:<6}|")
        out.append(bar)
    return out


def lci(gpu: Gpu) -> list[str]:
    if not mig_devices(gpu):
        raise ShimError("No compute instances found: Not Found", 6)
    bar = "+" + "-" * 68 + "+"
    out = [
        bar,
        "| Compute instances:" + " " * 49 + "|",
        "| GPU     GPU       Name             Profile   Instance   Placement  |",
        "|       Instance                       ID        ID       Start:Size |",
        "|         ID                                                         |",
        "|" + "=" * 68 + "|",
    ]
    for gi, ci in mig_devices(gpu):
        cs = compute_slices(gi["profile"])
        out.append(
            f"|{0:>4}{gi['gi']:>7}       {'MIG ' + gi['profile']:<16}{CI_PROFILE_BY_SLICES[cs]:>6}"
            f"{ci['ci']:>10}{0:>11}:{cs:<6}|"
        )
        out.append(bar)
    return out


def _fields(gpu: Gpu) -> dict[str, tuple[str, str]]:
    """``--query-gpu`` field -> (value, unit)."""
    c = gpu.config
    bus = gpu.bus_id
    return {
        "index": ("0", ""),
        "count": ("1", ""),
        "name": (str(c["name"]), ""),
        "uuid": (str(c["uuid"]), ""),
        "serial": (str(c["serial"]), ""),
        "pci.bus_id": (bus, ""),
        "gpu_bus_id": (bus, ""),
        "pci.domain": (f"0x{bus[:8][-4:]}", ""),
        "pci.bus": (f"0x{bus[9:11]}", ""),
        "pci.device_id": (str(c["device_id"]).upper().replace("0X", "0x"), ""),
        "driver_version": (str(c["driver_version"]), ""),
        "vbios_version": (str(c["vbios_version"]), ""),
        "memory.total": (str(c["memory_total_mib"]), "MiB"),
        "memory.used": ("0", "MiB"),
        "memory.free": (str(c["memory_total_mib"]), "MiB"),
        "mig.mode.current": (gpu.mode["current"], ""),
        "mig.mode.pending": (gpu.mode["pending"], ""),
        "persistence_mode": ("Enabled" if persistence_enabled(gpu) else "Disabled", ""),
        "compute_cap": ("12.0", ""),
    }


def query_gpu(gpu: Gpu, fields: str, fmt: str | None) -> list[str]:
    opts = (fmt or "").split(",")
    if "csv" not in opts:
        raise ShimError('Option "--format" must be given with "--query-gpu" (csv[,noheader][,nounits]).', 2)
    known = _fields(gpu)
    names = [f.strip() for f in fields.split(",") if f.strip()]
    for name in names:
        if name not in known:
            raise ShimError(f'Field "{name}" is not a valid field to query.\n', 2)
    gpu.check_alive()
    out = []
    if "noheader" not in opts:
        out.append(", ".join(f"{n} [{known[n][1]}]" if known[n][1] else n for n in names))
    units = "nounits" not in opts
    out.append(", ".join(known[n][0] + (f" {known[n][1]}" if units and known[n][1] else "") for n in names))
    return out


def query_xml(gpu: Gpu) -> list[str]:
    from xml.sax.saxutils import escape

    c = gpu.config
    bus = gpu.bus_id
    dev = str(c["device_id"]).upper().removeprefix("0X")
    devices = mig_devices(gpu)
    mig = ["<mig_devices>None</mig_devices>"] if not devices else ["<mig_devices>"]
    for n, (gi, ci) in enumerate(devices):
        row = profile_row(gi["profile"])
        dec, enc, jpeg, ofa, ce = row[8]
        mib = round(row[7] * 1024)
        mig += [
            f"<mig_device><index>{n}</index><gpu_instance_id>{gi['gi']}</gpu_instance_id>"
            f"<compute_instance_id>{ci['ci']}</compute_instance_id><device_attributes><shared>"
            f"<multiprocessor_count>{row[6]}</multiprocessor_count><copy_engine_count>{ce}</copy_engine_count>"
            f"<encoder_count>{enc}</encoder_count><decoder_count>{dec}</decoder_count><ofa_count>{ofa}</ofa_count>"
            f"<jpg_count>{jpeg}</jpg_count></shared></device_attributes><fb_memory_usage><total>{mib} MiB</total>"
            f"<reserved>0 MiB</reserved><used>0 MiB</used><free>{mib} MiB</free></fb_memory_usage></mig_device>"
        ]
    if devices:
        mig.append("</mig_devices>")
    total = c["memory_total_mib"]
    return [
        '<?xml version="1.0" ?>',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">',
        "<nvidia_smi_log>",
        f"<driver_version>{escape(str(c['driver_version']))}</driver_version>",
        f"<cuda_version>{escape(str(c['cuda_version']))}</cuda_version>",
        "<attached_gpus>1</attached_gpus>",
        f'<gpu id="{escape(bus)}">',
        f"<product_name>{escape(str(c['name']))}</product_name>",
        "<product_architecture>Blackwell</product_architecture>",
        f"<mig_mode><current_mig>{gpu.mode['current']}</current_mig>"
        f"<pending_mig>{gpu.mode['pending']}</pending_mig></mig_mode>",
        *mig,
        f"<serial>{escape(str(c['serial']))}</serial>",
        f"<uuid>{escape(str(c['uuid']))}</uuid>",
        f"<minor_number>{int(c.get('minor_number', 0))}</minor_number>",
        f"<vbios_version>{escape(str(c['vbios_version']))}</vbios_version>",
        f"<pci><pci_bus>{bus[9:11]}</pci_bus><pci_device>{bus[12:14]}</pci_device><pci_domain>{bus[:8][-4:]}"
        f"</pci_domain><pci_device_id>{dev}</pci_device_id><pci_bus_id>{escape(bus)}</pci_bus_id></pci>",
        f"<fb_memory_usage><total>{total} MiB</total><reserved>0 MiB</reserved><used>0 MiB</used>"
        f"<free>{total} MiB</free></fb_memory_usage>",
        "</gpu>",
        "</nvidia_smi_log>",
    ]


def query_text(gpu: Gpu) -> list[str]:
    c = gpu.config
    return [
        "",
        "==============NVSMI LOG==============",
        "",
        f"Driver Version                            : {c['driver_version']}",
        f"CUDA Version                              : {c['cuda_version']}",
        "",
        "Attached GPUs                             : 1",
        f"GPU {gpu.bus_id}",
        f"    Product Name                          : {c['name']}",
        "    MIG Mode",
        f"        Current                           : {gpu.mode['current']}",
        f"        Pending                           : {gpu.mode['pending']}",
        f"    GPU UUID                              : {c['uuid']}",
        f"    Minor Number                          : {int(c.get('minor_number', 0))}",
        f"    MIG Devices                           : {len(mig_devices(gpu)) or 'None'}",
    ]


# --- command line ----------------------------------------------------------------------------------

USAGE = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
FLAGS = {"-L", "--list-gpus", "-q", "--query", "-x", "--xml-format", "-r", "--gpu-reset", "--version", "-h", "--help"}
FLAGS |= {"-lgip", "-lgipp", "-lgi", "-lci", "-C", "--default-compute-instance", "-dci", "-dgi", "-cci"}
VALUED = {"-i", "--id", "-mig", "--multi-instance-gpu", "--query-gpu", "--format", "-cgi", "-gi", "-ci"}


def parse_args(argv: list[str]) -> dict[str, str]:
    opts: dict[str, str] = {}
    it = iter(argv)
    for arg in it:
        key, eq, value = arg.partition("=")
        if key in VALUED:
            if not eq:
                value = next(it, "")
                if not value:
                    raise ShimError(USAGE, 2)
            opts[key] = value
        elif arg in FLAGS:
            opts[arg] = ""
        else:
            raise ShimError(USAGE, 2)
    return opts


def _select_gpu(gpu: Gpu, opts: dict[str, str]) -> None:
    wanted = opts.get("-i", opts.get("--id"))
    if wanted is not None and not set(wanted.split(",")) <= {"0", gpu.bus_id, gpu.bus_id[4:], str(gpu.config["uuid"])}:
        raise ShimError("No devices were found", 6)


def _ids(value: str | None) -> set[int] | None:
    return None if value is None else {int(v) for v in value.split(",") if v.strip()}


def run_mig(gpu: Gpu, opts: dict[str, str]) -> list[str]:
    gpu.check_alive()
    gpu.require_mig()
    if "-lgip" in opts:
        return lgip(gpu)
    if "-lgipp" in opts:
        return lgipp(gpu)
    if "-lgi" in opts:
        return lgi(gpu)
    if "-lci" in opts:
        return lci(gpu)
    if "-cgi" in opts:
        return create(gpu, opts["-cgi"], "-C" in opts or "--default-compute-instance" in opts)
    if "-cci" in opts:
        return create_cis(gpu, _ids(opts.get("-gi")))
    if "-dci" in opts:
        return destroy_cis(gpu, _ids(opts.get("-gi")))
    if "-dgi" in opts:
        return destroy_gis(gpu, _ids(opts.get("-gi")))
    raise ShimError(USAGE, 2)


def create(gpu: Gpu, spec: str, with_ci: bool) -> list[str]:
    out: list[str] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        ref, _, start = item.partition(":")
        row = profile_row(ref)
        try:
            gi = gpu.create_gi(row, int(start) if start else None)
        except ShimError as exc:
            gpu.save()  # what was created before the failure stays, as on a real GPU
            detail = f"Unable to create a GPU instance on GPU  0 using profile {ref}: {exc.message}"
            raise ShimError(
                "\n".join([*out, detail, f"Failed to create GPU instances: {exc.message}"]), exc.code
            ) from None
        out.append(
            f"Successfully created GPU instance ID {gi['gi']:>2} on GPU  0 using profile MIG {row[0]} (ID {row[1]:>2})"
        )
        if with_ci:
            out.append(_ci_line(gi, gpu.create_ci(gi)))
    gpu.save()
    return out


def _ci_line(gi: dict[str, Any], ci: dict[str, Any]) -> str:
    cip = CI_PROFILE_BY_SLICES[compute_slices(gi["profile"])]
    return (
        f"Successfully created compute instance ID {ci['ci']:>2} on GPU  0 GPU instance ID {gi['gi']:>2} "
        f"using profile MIG {gi['profile']} (ID {cip:>2})"
    )


def create_cis(gpu: Gpu, only: set[int] | None) -> list[str]:
    targets = [gi for gi in gpu.state["instances"] if (only is None or gi["gi"] in only) and not gi["cis"]]
    if not targets:
        raise ShimError("No GPU instances found: Not Found", 6)
    out = [_ci_line(gi, gpu.create_ci(gi)) for gi in targets]
    gpu.save()
    return out


def destroy_cis(gpu: Gpu, only: set[int] | None) -> list[str]:
    out = []
    for gi in gpu.state["instances"]:
        if only is None or gi["gi"] in only:
            out += [
                f"Successfully destroyed compute instance ID {ci['ci']:>2} from GPU  0 GPU instance ID {gi['gi']:>2}"
                for ci in gi["cis"]
            ]
            gi["cis"] = []
    if not out:
        raise ShimError("No compute instances found: Not Found", 6)
    gpu.save()
    return out


def destroy_gis(gpu: Gpu, only: set[int] | None) -> list[str]:
    chosen = [gi for gi in gpu.instances if only is None or gi["gi"] in only]
    if not chosen:
        raise ShimError("No GPU instances found: Not Found", 6)
    out, busy = [], []
    for gi in chosen:
        if gi["cis"]:
            busy.append(f"Unable to destroy GPU instance ID {gi['gi']:>2} from GPU  0: In use by another client")
        else:
            gpu.state["instances"].remove(gi)
            out.append(f"Successfully destroyed GPU instance ID {gi['gi']:>2} from GPU  0")
    gpu.save()
    if busy:
        raise ShimError("\n".join([*out, *busy, "Failed to destroy GPU instances: In use by another client"]), 255)
    return out


NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def require_driver(root: Path) -> None:
    """On a simulated installed OS (its kernel stand-in keeps ``/run/sim-kmod``), nothing answers until the
    ``nvidia`` module is loaded, as on a real host; elsewhere (no kernel stand-in) the driver is taken as loaded."""
    kmod = root / "run/sim-kmod"
    if kmod.is_dir() and not (kmod / "nvidia").exists():
        raise ShimError(NO_DRIVER, 9)


def persistence_enabled(gpu: Gpu) -> bool:
    """The daemon runs and was not started with --no-persistence-mode (it writes its mode next to its pid)."""
    mode = gpu.persistenced_pid.with_name("persistence-mode")
    if not gpu.persistenced_pid.exists():
        return False
    return not mode.exists() or mode.read_text().strip() == "Enabled"


def run(argv: list[str], root: Path) -> list[str]:
    if not {"-h", "--help"} & set(argv):
        require_driver(root)
    if argv[:1] == ["mig"]:
        gpu = Gpu(root)
        opts = parse_args(argv[1:])
        _select_gpu(gpu, opts)
        return run_mig(gpu, opts)
    opts = parse_args(argv)
    gpu = Gpu(root)
    if "--version" in opts:
        c = gpu.config
        nvml = ".".join(str(c["driver_version"]).split(".")[:2])
        return [
            f"NVIDIA-SMI version  : {c['driver_version']}",
            f"NVML version        : {nvml}",
            f"DRIVER version      : {c['driver_version']}",
            f"CUDA Version        : {c['cuda_version']}",
        ]
    if "-h" in opts or "--help" in opts:
        return [__doc__ or ""]
    _select_gpu(gpu, opts)
    if "--query-gpu" in opts:
        return query_gpu(gpu, opts["--query-gpu"], opts.get("--format"))
    gpu.check_alive()
    if "-L" in opts or "--list-gpus" in opts:
        return list_gpus(gpu)
    if "-mig" in opts or "--multi-instance-gpu" in opts:
        value = opts.get("-mig", opts.get("--multi-instance-gpu"))
        if value not in ("0", "1"):
            raise ShimError(USAGE, 2)
        return gpu.set_mode(value == "1")
    if "-r" in opts or "--gpu-reset" in opts:
        return gpu.reset()
    if "-q" in opts or "--query" in opts:
        return query_xml(gpu) if ("-x" in opts or "--xml-format" in opts) else query_text(gpu)
    if not opts:
        return [*query_text(gpu)[3:5], *list_gpus(gpu)]
    raise ShimError(USAGE, 2)


HOLD_MAX_S = 900.0


def hold(root: Path) -> None:
    """Wait while the test's hold file exists; bounded, so a forgotten file can't hang a run for good."""
    gate, began = root / "var/lib/gpu-shim/hold", time.monotonic()
    while gate.exists() and time.monotonic() - began < HOLD_MAX_S:
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    root = Path(os.environ.get("GPU_SHIM_ROOT", "/"))
    hold(root)  # before the lock: a held call must not stall the others (the DRA plugin's)
    with contextlib.ExitStack() as stack:
        try:  # one nvidia-smi at a time: the DRA plugin, the playbook and mig-parted may overlap
            (root / "var/lib/gpu-shim").mkdir(parents=True, exist_ok=True)
            lock = stack.enter_context((root / "var/lib/gpu-shim/.lock").open("a"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:
            pass  # read-only or foreign root: run unlocked
        try:
            lines = run(sys.argv[1:] if argv is None else argv, root)
        except ShimError as exc:
            print(exc.message)
            return exc.code
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
