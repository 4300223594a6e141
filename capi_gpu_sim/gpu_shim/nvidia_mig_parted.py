#!/usr/bin/python3
"""A stand-in ``nvidia-mig-parted`` (apply / assert / export) that drives the simulated ``nvidia-smi``.

The ``mig_layout`` playbook role and the boot unit run the real tool's command lines against
simulated hosts, so this script keeps mig-parted's semantics (``pkg/mig/config``, v0.15):

* the config is ``version: v1`` with ``mig-configs: {name: [entries]}``; an entry applies to GPU 0 when
  its ``device-filter`` (absent, or a PCI id / list of them) matches and ``devices`` is ``all`` or lists
  0; a config with no matching entry does nothing, silently, as the real tool does;
* ``apply`` sets the MIG mode first (``nvidia-smi -mig``), resets the GPU when the mode is only pending
  (``--skip-reset`` leaves it pending), and fails when the reset is impossible: the caller reboots;
  then, unless ``--mode-only``, it leaves a matching layout alone, otherwise clears the instances and
  creates the profiles largest first, retrying other orders after a failure, as ``Flatten`` and
  ``iteratePermutationsUntilSuccess`` do;
* ``assert`` exits 0 when mode (and, without ``--mode-only``, the layout) match, 1 otherwise;
  ``--valid-config`` only parses; ``export`` prints the current state as a config named ``current``.

It is standalone (stdlib only) because it is installed as ``/usr/bin/nvidia-mig-parted``. All GPU
access goes through ``nvidia-smi`` (``$GPU_SHIM_NVIDIA_SMI``, default ``nvidia-smi`` on PATH; a path
ending in ``.py`` runs with this interpreter), so the state has one owner.

**YAML:** stdlib has no YAML parser, so the config may be JSON, or the block YAML subset mig-parted
configs are written in: nested ``key: value`` mappings and ``- `` sequences by indentation, ``#``
comments, quoted or plain scalars, ints, booleans, and flow ``[...]`` / ``{...}`` collections. That
covers ``capi_gpu.gpu.migparted.render`` output and mig-parted's own ``config-default.yaml``; anchors,
multi-line scalars and multiple documents are refused with a message.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any


class PartedError(Exception):
    pass


# --- YAML subset -----------------------------------------------------------------------------------


def load_config(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    lines: list[tuple[int, str]] = []
    for raw in text.splitlines():
        body = _strip_comment(raw).rstrip()
        if not body.strip() or body.strip() in ("---", "..."):
            continue
        if body.lstrip().startswith(("&", "*", "!", "|", ">")) or re.search(r":\s+[|>&*!]", body):
            raise PartedError(f"unsupported YAML construct in config: {raw.strip()!r}")
        lines.append((len(body) - len(body.lstrip(" ")), body.strip()))
    if not lines:
        return None
    value, end = _block(lines, 0, lines[0][0])
    if end != len(lines):
        raise PartedError(f"unexpected indentation in config at {lines[end][1]!r}")
    return value


def _strip_comment(line: str) -> str:
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _block(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[Any, int]:
    if lines[i][1] == "-" or lines[i][1].startswith("- "):
        items: list[Any] = []
        while i < len(lines) and lines[i][0] == indent and (lines[i][1] == "-" or lines[i][1].startswith("- ")):
            rest = lines[i][1][1:].strip()
            if not rest:
                value, i = _block(lines, i + 1, lines[i + 1][0])
            elif _split_key(rest) is not None:
                lines[i] = (indent + len(lines[i][1]) - len(rest), rest)  # the item's keys line up here
                value, i = _block(lines, i, lines[i][0])
            else:
                value, i = _scalar(rest), i + 1
            items.append(value)
        return items, i
    mapping: dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent:
        split = _split_key(lines[i][1])
        if split is None:
            raise PartedError(f"expected 'key: value' in config, got {lines[i][1]!r}")
        key, rest = split
        i += 1
        if rest:
            mapping[key] = _scalar(rest)
        elif i < len(lines) and (lines[i][0] > indent or (lines[i][0] == indent and lines[i][1].startswith("-"))):
            mapping[key], i = _block(lines, i, lines[i][0])
        else:
            mapping[key] = None
    return mapping, i


def _split_key(text: str) -> tuple[str, str] | None:
    if text[:1] in "\"'":
        end = text.find(text[0], 1)
        if end < 0 or text[end + 1 : end + 2] != ":":
            return None
        return text[1:end], text[end + 2 :].strip()
    m = re.match(r"^([^\s:\[\]{},][^:]*?):(\s+(.*))?$", text)
    return None if m is None else (m[1], (m[3] or "").strip())


def _scalar(text: str) -> Any:
    value, end = _flow(text, 0)
    if text[end:].strip():
        raise PartedError(f"cannot parse config value {text!r}")
    return value


def _flow(text: str, i: int) -> tuple[Any, int]:
    while i < len(text) and text[i] == " ":
        i += 1
    if text[i : i + 1] in ("[", "{"):
        close = "]" if text[i] == "[" else "}"
        items: list[Any] = []
        pairs: dict[str, Any] = {}
        i += 1
        while True:
            while i < len(text) and text[i] in " ,":
                i += 1
            if text[i : i + 1] == close:
                return (items if close == "]" else pairs), i + 1
            if i >= len(text):
                raise PartedError(f"unterminated flow collection in {text!r}")
            item, i = _flow(text, i)
            if close == "}":
                while text[i : i + 1] == " ":
                    i += 1
                if text[i : i + 1] != ":":
                    raise PartedError(f"expected ':' in {text!r}")
                pairs[str(item)], i = _flow(text, i + 1)
            else:
                items.append(item)
    if text[i : i + 1] in "\"'":
        end = text.find(text[i], i + 1)
        if end < 0:
            raise PartedError(f"unterminated string in {text!r}")
        return text[i + 1 : end], end + 1
    m = re.match(r"[^,\]}:]*(?::(?!\s)[^,\]}:]*)*", text[i:])
    word = (m[0] if m else "").strip()
    return _plain(word), i + (len(m[0]) if m else 0)


def _plain(word: str) -> Any:
    if re.fullmatch(r"-?\d+", word):
        return int(word)
    return {"true": True, "false": False, "null": None, "~": None}.get(word.lower(), word)


# --- the GPU, through nvidia-smi -------------------------------------------------------------------


def smi(*args: str) -> tuple[int, str]:
    cmd = shlex.split(os.environ.get("GPU_SHIM_NVIDIA_SMI", "nvidia-smi"))
    if cmd[0].endswith(".py"):
        cmd = [sys.executable, *cmd]
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, check=False, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr


def smi_ok(*args: str) -> str:
    rc, out = smi(*args)
    if rc != 0:
        raise PartedError(f"nvidia-smi {' '.join(args)} failed ({rc}): {out.strip()}")
    return out


def gpu_mode() -> tuple[int, str, str]:
    out = smi_ok("-i", "0", "--query-gpu=pci.device_id,mig.mode.current,mig.mode.pending", "--format=csv,noheader")
    dev, current, pending = (v.strip() for v in out.strip().splitlines()[0].split(","))
    return int(dev, 16) >> 16, current, pending


def current_layout() -> Counter[str]:
    rc, lgi = smi("mig", "-i", "0", "-lgi")
    if rc != 0:
        return Counter()
    gis = {int(m[2]): m[1] for m in re.finditer(r"^\|\s+\d+\s+MIG\s+(\S+)\s+\d+\s+(\d+)\s+\d+:\d+\s+\|$", lgi, re.M)}
    rc, lci = smi("mig", "-i", "0", "-lci")
    with_ci = {int(m[1]) for m in re.finditer(r"^\|\s+\d+\s+(\d+)\s+MIG\s+\S+\s+\d+\s+\d+\s+\d+:\d+\s+\|$", lci, re.M)}
    return Counter(profile for gi, profile in gis.items() if rc == 0 and gi in with_ci)


# --- mig-parted semantics --------------------------------------------------------------------------


def _device_ids(value: Any) -> set[int]:
    items = value if isinstance(value, list) else [value]
    out = set()
    for item in items:
        text = str(item).lower().removeprefix("0x")
        out.add(int(text[:4], 16) if len(text) == 8 else int(text, 16))
    return out


def select(doc: Any, name: str, device_id: int) -> dict[str, Any] | None:
    """The entry of config ``name`` that applies to GPU 0, or None."""
    if not isinstance(doc, dict) or doc.get("version") != "v1" or not isinstance(doc.get("mig-configs"), dict):
        raise PartedError("error parsing config file: expected 'version: v1' and a 'mig-configs' mapping")
    if name not in doc["mig-configs"]:
        raise PartedError(f"selected mig-config not present: {name}")
    for entry in doc["mig-configs"][name] or []:
        if not isinstance(entry, dict) or "devices" not in entry or "mig-enabled" not in entry:
            raise PartedError(f"error parsing config {name}: each entry needs 'devices' and 'mig-enabled'")
        if "device-filter" in entry and device_id not in _device_ids(entry["device-filter"]):
            continue
        if entry["devices"] == "all" or (isinstance(entry["devices"], list) and 0 in entry["devices"]):
            return entry
    return None


def wanted_devices(entry: dict[str, Any]) -> Counter[str]:
    devices = entry.get("mig-devices") or {}
    if not isinstance(devices, dict) or any(not isinstance(n, int) or n < 0 for n in devices.values()):
        raise PartedError("error parsing config: mig-devices must map profiles to non-negative counts")
    return Counter({str(k): v for k, v in devices.items() if v > 0})


def flatten(devices: Counter[str]) -> list[str]:
    def key(profile: str) -> tuple[int, str]:
        return (-int(profile.split("g.", 1)[0]), profile)

    return sorted(devices.elements(), key=key)


def clear() -> None:
    for op in ("-dci", "-dgi"):
        rc, out = smi("mig", "-i", "0", op)
        if rc not in (0, 6):
            raise PartedError(f"error clearing MIG config: {out.strip()}")


def apply_mode(enabled: bool, skip_reset: bool) -> None:
    want = "Enabled" if enabled else "Disabled"
    _, current, pending = gpu_mode()
    if current == want and pending == want:
        return
    if not enabled and current == "Enabled":
        clear()
    smi_ok("-i", "0", "-mig", "1" if enabled else "0")
    _, current, _pending = gpu_mode()
    if current != want and not skip_reset:
        rc, out = smi("-i", "0", "--gpu-reset")
        if rc != 0:
            raise PartedError(f"error resetting GPU 0 to apply MIG mode {want}; reboot to apply it: {out.strip()}")
        _, current, _pending = gpu_mode()
    if current != want and not skip_reset:
        raise PartedError(f"MIG mode is still {current} after the reset, want {want}")


def apply_devices(devices: Counter[str]) -> None:
    if current_layout() == devices:
        log("MIG configuration already applied")
        return
    profiles = flatten(devices)
    seen: set[tuple[str, ...]] = set()
    for order in itertools.islice(itertools.permutations(profiles), 5040):
        if order in seen:
            continue
        seen.add(order)
        clear()
        if not order:
            return
        rc, out = smi("mig", "-i", "0", "-cgi", ",".join(order), "-C")
        if rc == 0:
            return
        log(f"error creating instances in order {','.join(order)}: {out.strip().splitlines()[-1]}", "error")
    clear()
    raise PartedError("error attempting multiple config orderings: all orderings failed")


def log(msg: str, level: str = "info") -> None:
    print(f'level={level} msg="{msg}"', file=sys.stderr)


def export() -> str:
    _, current, _ = gpu_mode()
    lines = ["version: v1", "mig-configs:", "  current:", "    - devices: all"]
    if current != "Enabled":
        return "\n".join([*lines, "      mig-enabled: false"]) + "\n"
    layout = current_layout()
    lines.append("      mig-enabled: true")
    if not layout:
        return "\n".join([*lines, "      mig-devices: {}"]) + "\n"
    lines.append("      mig-devices:")
    lines += [f"        {json.dumps(p)}: {n}" for p, n in sorted(layout.items())]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> tuple[str, dict[str, str]]:
    if not argv:
        raise PartedError("usage: nvidia-mig-parted apply|assert|export [-f FILE] [-c NAME] [--mode-only]")
    verb, opts, it = argv[0], {}, iter(argv[1:])
    aliases = {"--config-file": "-f", "--selected-config": "-c", "-m": "--mode-only", "-a": "--valid-config"}
    for arg in it:
        key, eq, value = arg.partition("=")
        key = aliases.get(key, key)
        if key in ("-f", "-c", "-o", "--output-format"):
            opts[key] = value if eq else next(it, "")
        elif key in ("--mode-only", "--valid-config", "--skip-reset", "-d", "--debug"):
            opts[key] = ""
        else:
            raise PartedError(f"flag provided but not defined: {arg}")
    opts.setdefault("-f", os.environ.get("MIG_PARTED_CONFIG_FILE", ""))
    opts.setdefault("-c", os.environ.get("MIG_PARTED_SELECTED_CONFIG", ""))
    return verb, opts


def run(argv: list[str]) -> int:
    verb, opts = parse_args(argv)
    if verb in ("--version", "version"):
        print("nvidia-mig-parted version 0.15.0 (capi-gpu gpu shim)")
        return 0
    if verb == "export":
        print(export(), end="")
        return 0
    if verb not in ("apply", "assert") or not opts["-f"] or not opts["-c"]:
        raise PartedError(f"usage: nvidia-mig-parted {verb} -f <config file> -c <selected config>")
    doc = load_config(Path(opts["-f"]).read_text())
    device_id, current, pending = gpu_mode()
    entry = select(doc, opts["-c"], device_id)
    if entry is not None:
        wanted = wanted_devices(entry)
    if verb == "assert" and "--valid-config" in opts:
        log("Selected MIG configuration is valid")
        return 0
    if entry is None:
        log(f"no entry of {opts['-c']} applies to GPU 0 (device 0x{device_id:04X}): nothing to do")
        return 0
    enabled = bool(entry["mig-enabled"])
    if verb == "apply":
        apply_mode(enabled, "--skip-reset" in opts)
        if enabled and "--mode-only" not in opts:
            apply_devices(wanted)
        log("MIG configuration applied successfully")
        return 0
    want = "Enabled" if enabled else "Disabled"
    ok = current == want and pending == want
    if ok and enabled and "--mode-only" not in opts:
        ok = current_layout() == wanted
    if not ok:
        print("Assertion failure: selected configuration not currently applied", file=sys.stderr)
        return 1
    log("Selected MIG configuration currently applied")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except (PartedError, OSError, subprocess.SubprocessError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
