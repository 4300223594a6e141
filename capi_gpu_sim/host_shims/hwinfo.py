"""`lsblk`, `lspci`, `smartctl` and `nproc` for a simulated GEX131, one multi-call script (dispatch on argv[0]).

Why shims and not the real tools: inside a host's namespace the real tools would read the test
machine's sysfs and show its virtio disk and CPUs, not two 960 GB NVMe drives, an RTX PRO 6000 and 48
threads. These print what the real tools print on a GEX131 (util-linux 2.38 lsblk JSON/pairs, pciutils
`-nn` lines, smartmontools 7.3 health output, coreutils nproc), from the host's hardware description that
the simulator bind-mounts read-only at ``/run/sim/hw/hardware.json`` (knobs such as SMART health or "GPU
off the bus" are flipped there from the test side). Partitions come from ``/run/sim/disk/partitions.json``
(the rescue view's window onto the host's "disk"), written by the installimage shim.

Runs inside the guest with the guest's python3 and the standard library only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HW_PATH = Path(os.environ.get("SIM_HW_PATH", "/run/sim/hw/hardware.json"))
PARTS_PATH = Path(os.environ.get("SIM_PARTS_PATH", "/run/sim/disk/partitions.json"))

LSBLK_DEFAULT = ["NAME", "MAJ:MIN", "RM", "SIZE", "RO", "TYPE", "MOUNTPOINTS"]
LSBLK_KNOWN = {
    "NAME",
    "KNAME",
    "PATH",
    "MAJ:MIN",
    "RM",
    "SIZE",
    "RO",
    "TYPE",
    "MOUNTPOINT",
    "MOUNTPOINTS",
    "WWN",
    "MODEL",
    "SERIAL",
    "ROTA",
    "VENDOR",
    "HCTL",
    "FSTYPE",
    "PARTTYPENAME",
    "TRAN",
    "LABEL",
    "UUID",
}


def _load(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def human_size(n: int) -> str:
    """util-linux's size_to_human_string: powers of 1024, one decimal, trailing .0 dropped."""
    units = "BKMGTPE"
    value, exp = float(n), 0
    while value >= 1024 and exp < len(units) - 1:
        value /= 1024
        exp += 1
    if exp == 0:
        return f"{n}B"
    text = f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{text}{units[exp]}"


def _rows(hw: dict[str, Any], parts: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for i, disk in enumerate(hw.get("disks", [])):
        children = []
        for j, part in enumerate(parts.get(disk["name"], []), start=1):
            children.append(
                {
                    "NAME": f"{disk['name']}p{j}",
                    "MAJ:MIN": f"259:{i * 16 + j}",
                    "RM": False,
                    "RO": False,
                    "SIZE": part["size"],
                    "TYPE": part.get("type", "part"),
                    "FSTYPE": part.get("fstype"),
                    "PARTTYPENAME": part.get("parttypename", "Linux filesystem"),
                    "WWN": disk.get("wwn"),
                    "MOUNTPOINT": None,
                    "MODEL": None,
                    "SERIAL": None,
                    "ROTA": bool(disk.get("rota")),
                    "VENDOR": None,
                    "HCTL": None,
                    "TRAN": None,
                }
            )
        rows.append(
            {
                "NAME": disk["name"],
                "MAJ:MIN": f"259:{i * 16}",
                "RM": False,
                "RO": False,
                "SIZE": disk["size"],
                "TYPE": "disk",
                "WWN": disk.get("wwn"),
                "MODEL": disk.get("model"),
                "SERIAL": disk.get("serial"),
                "ROTA": bool(disk.get("rota")),
                "VENDOR": None,
                "HCTL": None,
                "FSTYPE": None,
                "PARTTYPENAME": None,
                "TRAN": "nvme",
                "MOUNTPOINT": None,
                "children": children,
            }
        )
    return rows


def _value(row: dict[str, Any], col: str, as_bytes: bool) -> Any:
    if col in ("KNAME",):
        return row["NAME"]
    if col == "PATH":
        return f"/dev/{row['NAME']}"
    if col == "MOUNTPOINTS":
        return [None]
    if col == "SIZE":
        return row["SIZE"] if as_bytes else human_size(int(row["SIZE"]))
    return row.get(col)


def _text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, list):
        return ""
    return str(v)


LONG_FLAGS = {
    "--json": "J",
    "--pairs": "P",
    "--list": "l",
    "--raw": "r",
    "--nodeps": "d",
    "--noheadings": "n",
    "--bytes": "b",
    "--all": "a",
}


def _dev_name(path: str) -> str:
    return os.path.basename(os.path.realpath(path)) if path.startswith("/dev/disk/") else path[5:]


def _lsblk_args(argv: list[str]) -> tuple[list[str], set[str], list[str]]:
    """(columns, single-letter flags, devices); raises ValueError with lsblk's message."""
    cols, flags, only = list(LSBLK_DEFAULT), set(), []
    args = iter(argv)
    for arg in args:
        if arg in ("-o", "--output"):
            cols = next(args, "").upper().split(",")
        elif arg.startswith("--output="):
            cols = arg.split("=", 1)[1].upper().split(",")
        elif arg.startswith("-o"):
            cols = arg[2:].upper().split(",")
        elif arg.startswith("/dev/"):
            only.append(_dev_name(arg))
        elif arg.startswith("--"):
            if arg not in LONG_FLAGS:
                raise ValueError(f"lsblk: unrecognized option '{arg}'")
            flags.add(LONG_FLAGS[arg])
        elif arg.startswith("-"):
            bad = [f for f in arg[1:] if f not in "JPlrdnbae"]
            if bad:
                raise ValueError(f"lsblk: invalid option -- '{bad[0]}'")
            flags.update(arg[1:])
    unknown = [c for c in cols if c not in LSBLK_KNOWN]
    if unknown:
        raise ValueError(f"lsblk: unknown column: {unknown[0]}")
    return cols, flags, only


def lsblk(argv: list[str]) -> int:
    try:
        cols, flags, only = _lsblk_args(argv)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    as_bytes = "b" in flags
    rows = _rows(_load(HW_PATH, {}), _load(PARTS_PATH, {}))
    if only:
        missing = [d for d in only if d not in {r["NAME"] for r in rows}]
        if missing:
            print(f"lsblk: /dev/{missing[0]}: not a block device", file=sys.stderr)
            return 32
        rows = [r for r in rows if r["NAME"] in only]
    if "d" in flags:
        rows = [{**r, "children": []} for r in rows]
    if "J" in flags:
        print(json.dumps({"blockdevices": [_json_row(r, cols, as_bytes) for r in rows]}, indent=3))
        return 0
    flat_rows = [x for r in rows for x in [r, *r.get("children", [])]]
    if "P" in flags:
        for r in flat_rows:
            print(" ".join(f'{c}="{_text(_value(r, c, as_bytes))}"' for c in cols))
        return 0
    if "n" not in flags:
        print(" ".join(cols))
    for r in flat_rows:
        print(" ".join(_text(_value(r, c, as_bytes)) for c in cols))
    return 0


def _json_row(row: dict[str, Any], cols: list[str], as_bytes: bool) -> dict[str, Any]:
    out = {c.lower(): _value(row, c, as_bytes) for c in cols}
    kids = row.get("children") or []
    if kids:
        out["children"] = [_json_row(k, cols, as_bytes) for k in kids]
    return out


def _gpu_lost() -> bool:
    """The GPU shim's view (installed OS): lost until reboot, or its persistent ``lost`` knob."""
    if Path("/run/gpu-shim/lost").exists():
        return True
    return bool(_load(Path("/var/lib/gpu-shim/config.json"), {}).get("lost"))


def lspci(argv: list[str]) -> int:
    hw = _load(HW_PATH, {})
    lost = _gpu_lost()
    numeric = "-nn" in argv or "-n" in argv
    domain = "-D" in argv
    vendor_filter = None
    if "-d" in argv:
        vendor_filter = argv[argv.index("-d") + 1] if argv.index("-d") + 1 < len(argv) else None
    for dev in hw.get("pci", []):
        if vendor_filter:
            want_v, _, want_d = vendor_filter.partition(":")
            if (want_v and want_v != dev["vendor"]) or (want_d and want_d != dev["device"]):
                continue
        slot = dev["slot"] if domain else dev["slot"].split(":", 1)[1]
        is_gpu = dev["vendor"] == "10de" and dev["class"].startswith("03")
        rev = "ff" if dev.get("lost") or (lost and is_gpu) else dev.get("rev")
        cls = f"{dev['class_name']} [{dev['class']}]" if numeric else dev["class_name"]
        ids = f" [{dev['vendor']}:{dev['device']}]" if numeric else ""
        tail = f" (rev {rev})" if rev else ""
        print(f"{slot} {cls}: {dev['vendor_name']} {dev['device_name']}{ids}{tail}")
    return 0


def smartctl(argv: list[str]) -> int:
    hw = _load(HW_PATH, {})
    devices = [a for a in argv if a.startswith("/dev/")]
    print("smartctl 7.3 2022-02-28 r5338 [x86_64-linux-6.1.0-sim] (local build)")
    print("Copyright (C) 2002-22, Bruce Allen, Christian Franke, www.smartmontools.org\n")
    if not devices or not {"-H", "--health", "-a"} & set(argv):
        print("ERROR: smartctl requires a device name and an option such as -H", file=sys.stderr)
        return 1
    name = _dev_name(devices[0])
    disk = next((d for d in hw.get("disks", []) if d["name"] == name), None)
    if disk is None:
        print(f"Smartctl open device: {devices[0]} failed: No such device")
        return 2
    print("=== START OF SMART DATA SECTION ===")
    if disk.get("smart", "PASSED") == "PASSED":
        print("SMART overall-health self-assessment test result: PASSED\n")
        return 0
    print("SMART overall-health self-assessment test result: FAILED!")
    print("- NVM subsystem reliability has been degraded\n")
    return 8


def nproc(argv: list[str]) -> int:
    """coreutils ``nproc``: the hardware's threads; OMP_NUM_THREADS / OMP_THREAD_LIMIT unless ``--all``."""
    count = int(_load(HW_PATH, {}).get("cpu", {}).get("threads") or os.cpu_count() or 1)
    every, ignore = False, "0"
    args = iter(argv)
    for arg in args:
        if arg == "--all":
            every = True
        elif arg.startswith("--ignore="):
            ignore = arg.split("=", 1)[1]
        elif arg == "--ignore":
            ignore = next(args, "")
        elif arg.startswith("-"):
            print(f"nproc: unrecognized option '{arg}'", file=sys.stderr)
            return 1
        else:
            print(f"nproc: extra operand '{arg}'", file=sys.stderr)
            return 1
    if not ignore.isdigit():
        print(f"nproc: invalid number: '{ignore}'", file=sys.stderr)
        return 1
    if not every:
        first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
        count = int(first) if first.isdigit() and int(first) > 0 else count
        limit = os.environ.get("OMP_THREAD_LIMIT", "").strip()
        count = min(count, int(limit)) if limit.isdigit() and int(limit) > 0 else count
    print(max(1, count - int(ignore)))
    return 0


def main() -> int:
    tool = os.path.basename(sys.argv[0])
    handlers = {"lsblk": lsblk, "lspci": lspci, "smartctl": smartctl, "nproc": nproc}
    handler = handlers.get(tool)
    if handler is None:
        print(f"hwinfo: unknown tool {tool}", file=sys.stderr)
        return 127
    return handler(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
