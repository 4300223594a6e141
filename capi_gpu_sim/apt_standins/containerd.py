"""`containerd` for the simulated installed OS: loads its config the way the daemon does, then idles.

Why not a plain sleep: the playbook's containerd template is production code, and the one thing the
simulation can check about it is what containerd would make of it. So this parses the TOML (a broken
file fails the unit, as with the real daemon), resolves whether the CRI plugin is on and CDI enabled
for config versions 2 (containerd 1.7) and 3 (2.x), and writes that verdict to
``/run/containerd/sim-effective.json`` for tests. Standard library only (tomllib, Python >= 3.11).
"""

from __future__ import annotations

import json
import signal
import sys
import tomllib
from pathlib import Path
from typing import Any

VERSION = "@VERSION@"
DEFAULT_CONFIG = Path("/etc/containerd/config.toml")
EFFECTIVE = Path("/run/containerd/sim-effective.json")
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


def effective(doc: dict[str, Any]) -> dict[str, Any]:
    version = int(doc.get("version", 1))
    if version not in CRI_PLUGIN:
        raise ValueError(f"unsupported config version {version}")
    disabled = {str(p) for p in doc.get("disabled_plugins", [])}
    cri = doc.get("plugins", {}).get(CRI_PLUGIN[version], {})
    cri_off = bool(disabled & {"cri", "io.containerd.grpc.v1.cri", CRI_PLUGIN[version]})
    # containerd 2.x enables CDI by default; 1.7 does not.
    return {
        "version": version,
        "cri": not cri_off,
        "enable_cdi": bool(cri.get("enable_cdi", version == 3)),
        "cdi_spec_dirs": list(cri.get("cdi_spec_dirs", ["/etc/cdi", "/var/run/cdi"])),
    }


def main(argv: list[str]) -> int:
    if "--version" in argv or "-v" in argv:
        print(f"containerd containerd.io {VERSION} capi-gpu-sim")
        return 0
    path = DEFAULT_CONFIG
    for flag in ("--config", "-c"):
        if flag in argv and argv.index(flag) + 1 < len(argv):
            path = Path(argv[argv.index(flag) + 1])
    try:
        verdict = effective(tomllib.loads(path.read_text()) if path.exists() else {"version": 3})
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        print(f"containerd: failed to load TOML from {path}: {exc}", file=sys.stderr)
        return 1
    EFFECTIVE.parent.mkdir(parents=True, exist_ok=True)
    EFFECTIVE.write_text(json.dumps(verdict))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
