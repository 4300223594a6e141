"""`nvidia-ctk cdi generate|list` for the simulated installed OS, from what ``nvidia-smi -L`` shows.

Why: the playbook generates the CDI spec after the driver install and after every MIG change (and the
boot unit at every boot); what tests need to see is that the spec lists exactly the devices that exist
at that moment, named the way nvidia-ctk names them (``0``, ``GPU-<uuid>``, ``0:<mig index>``,
``MIG-<uuid>``, ``all``). Used only when the GPU shim package provides no nvidia_ctk of its own.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

VERSION = "@VERSION@"
GPU = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[^)]+)\)")
MIG = re.compile(r"^\s+MIG \S+\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)")


def devices() -> list[str]:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True, timeout=30).stdout
    names: list[str] = []
    gpu = ""
    for line in out.splitlines():
        if m := GPU.match(line):
            gpu = m.group(1)
            names += [gpu, m.group(2)]
        elif (m := MIG.match(line)) and gpu:
            names += [f"{gpu}:{m.group(1)}", m.group(2)]
    return [*names, "all"] if names else []


def spec(names: list[str]) -> str:
    edits = {"deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]}
    doc = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "containerEdits": edits,
        "devices": [{"name": n, "containerEdits": {}} for n in names],
    }
    return json.dumps(doc, indent=2) + "\n"  # JSON is YAML; the real tool writes YAML by default


def main(argv: list[str]) -> int:
    if "--version" in argv:
        print(f"NVIDIA Container Toolkit CLI version {VERSION} (capi-gpu-sim)")
        return 0
    if argv[:2] == ["cdi", "generate"]:
        out = next((a.split("=", 1)[1] for a in argv if a.startswith("--output=")), None)
        text = spec(devices())
        if out is None:
            sys.stdout.write(text)
        else:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(out + ".tmp")
            tmp.write_text(text)
            tmp.replace(out)
        return 0
    if argv[:2] == ["cdi", "list"]:
        print("\n".join(f"nvidia.com/gpu={n}" for n in devices()))
        return 0
    print(f"nvidia-ctk: unsupported arguments {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
