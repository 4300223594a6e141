"""`reboot` / `poweroff` for the simulated rescue system, where sshd (not systemd) is PID 1.

Why a syscall and not a signal to PID 1: the kernel turns reboot(2) inside a PID namespace into
"kill this namespace's init" (SIGHUP for restart, SIGINT for power-off), which is exactly what
``systemctl reboot`` ends with in the installed OS; the simulator's supervisor sees the same exit
status (129 / 130) for both boot modes and picks the next boot target from Robot's state.

The call is made from a detached child after a short pause, so the SSH command that asked for the
reboot returns first (CAPH treats a vanished session as success, but a clean exit is kinder).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

RESTART = 0x01234567
POWER_OFF = 0x4321FEDC
MAGIC1, MAGIC2 = 0xFEE1DEAD, 672274793


def _detach_and_call(cmd: int, delay: float) -> None:
    if os.fork() != 0:
        return
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    time.sleep(delay)
    os.sync()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall(169, MAGIC1, MAGIC2, cmd, None)  # SYS_reboot on x86_64
    os._exit(1)


def main() -> int:
    tool = os.path.basename(sys.argv[0])
    args = sys.argv[1:]
    off = tool in ("poweroff", "halt") or (tool == "shutdown" and "-r" not in args)
    print("Powering off." if off else "Rebooting.", flush=True)
    _detach_and_call(POWER_OFF if off else RESTART, 0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
