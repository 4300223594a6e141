"""A daemon or CLI stand-in that only answers ``--version`` (and ``version``) and otherwise idles.

Why: kubelet, kubectl and nvidia-persistenced must exist in the simulated installed OS so the playbook
can install, hold, enable and start them like on a real node, but nothing in the simulation needs what
they do (the test side simulates the kubelet from kubeadm's join record). ``@NAME@``, ``@VERSION@``,
``@DAEMON@`` and ``@PIDFILE@`` are filled in when capi_gpu_sim.aptrepo packages the script.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

NAME: str = "@NAME@"
VERSION: str = "@VERSION@"
DAEMON: str = "@DAEMON@"  # "yes": idle until SIGTERM; "no": a CLI
PIDFILE: str = "@PIDFILE@"  # written while the daemon runs, when set


def main(argv: list[str]) -> int:
    if "--version" in argv or (argv[:1] == ["version"]):
        print(f"{NAME} {VERSION} (capi-gpu-sim)")
        return 0
    if DAEMON != "yes":
        print(f"{NAME}: simulated stand-in; only --version is implemented", file=sys.stderr)
        return 1
    if PIDFILE and not PIDFILE.startswith("@"):
        Path(PIDFILE).parent.mkdir(parents=True, exist_ok=True)
        Path(PIDFILE).write_text(f"{os.getpid()}\n")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            signal.pause()
    finally:
        if PIDFILE and not PIDFILE.startswith("@"):
            Path(PIDFILE).unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
