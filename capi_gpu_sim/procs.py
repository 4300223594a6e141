"""Child processes that cannot outlive their parent.

Every component of the local control plane runs under ``Proc``: its own session (so a signal reaches
its whole tree), ``PR_SET_PDEATHSIG`` (so a SIGKILLed test run still takes its children with it), a log
file per component, and a pid registry on disk so ``reap_strays`` can clean up after anything worse.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Proc:
    """One supervised process with its log."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        registry: Path | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_dir / f"{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, async-signal-safe
            env=None if env is None else {**os.environ, **env},
            cwd=cwd,
        )
        self._registry = registry
        if registry is not None:
            registry.parent.mkdir(parents=True, exist_ok=True)
            with registry.open("a") as fh:
                fh.write(f"{self.popen.pid} {name}\n")

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        else:
            # The leader exited; members of its group may not have.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        self._log.close()


def reap_strays(registry: Path) -> list[int]:
    """Kill every process group recorded in ``registry`` that still runs; returns the pids killed."""
    killed: list[int] = []
    if not registry.exists():
        return killed
    for line in registry.read_text().splitlines():
        pid = int(line.split()[0])
        try:
            os.killpg(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_exists(p) for p in killed):
        time.sleep(0.05)
    registry.unlink(missing_ok=True)
    return killed


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); read its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
