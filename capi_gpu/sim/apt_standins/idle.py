"""A daemon or CLI stand-in that only answers ``--version`` (and ``version``) and otherwise idles.

Why: kubelet, kubectl and nvidia-persistenced must exist in the simulated installed OS so the playbook
can install, hold, enable and start them like on a real node, but nothing in the simulation needs what
they do (the test side simulates the kubelet from kubeadm's join record). ``@NAME@`` and ``@VERSION@``
are filled in when capi_gpu.sim.aptrepo packages the script.
"""

from __future__ import annotations

import signal
import sys

NAME: str = "@NAME@"
VERSION: str = "@VERSION@"
DAEMON: str = "@DAEMON@"  # "yes": idle until SIGTERM; "no": a CLI


def main(argv: list[str]) -> int:
    if "--version" in argv or (argv[:1] == ["version"]):
        print(f"{NAME} {VERSION} (capi-gpu-sim)")
        return 0
    if DAEMON != "yes":
        print(f"{NAME}: simulated stand-in; only --version is implemented", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
