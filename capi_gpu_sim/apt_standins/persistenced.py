"""A stand-in ``nvidia-persistenced``: forks like the real daemon, and fails like it without a loaded driver.

Why not an idle loop: the real daemon (started ``Type=forking`` by Ubuntu's unit) opens the GPU's device
nodes during initialisation and exits non-zero when the ``nvidia`` module is not loaded, so a playbook that
starts it before loading the module fails on a real host. And Ubuntu's unit passes ``--no-persistence-mode``:
the daemon then runs, but persistence mode stays off. This stand-in does both: it reads the simulated
kernel's module state (``/run/sim-kmod``, see ``capi_gpu_sim.host_shims.kmod``), and writes its pid and its
persistence mode next to each other under ``/run/nvidia-persistenced``, where the GPU shim reads them.
``@VERSION@`` is filled in when capi_gpu_sim.aptrepo packages the script.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

VERSION: str = "@VERSION@"
RUN = Path("/run/nvidia-persistenced")
KMOD = Path("/run/sim-kmod")


def main(argv: list[str]) -> int:
    if "--version" in argv or "-v" in argv:
        print(f"nvidia-persistenced: version {VERSION} (capi-gpu-sim)")
        return 0
    if KMOD.is_dir() and not (KMOD / "nvidia").exists():
        print("nvidia-persistenced failed to initialize. Check syslog for more details.", file=sys.stderr)
        return 1
    mode = "Disabled" if "--no-persistence-mode" in argv else "Enabled"
    read, write = os.pipe()
    if os.fork() > 0:  # the parent returns once the daemon is up, as Type=forking expects
        os.close(write)
        os.read(read, 1)
        return 0
    os.close(read)
    os.setsid()
    RUN.mkdir(parents=True, exist_ok=True)
    (RUN / "persistence-mode").write_text(mode + "\n")
    (RUN / "nvidia-persistenced.pid").write_text(f"{os.getpid()}\n")
    os.write(write, b"1")
    os.close(write)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            signal.pause()
    finally:
        (RUN / "nvidia-persistenced.pid").unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
