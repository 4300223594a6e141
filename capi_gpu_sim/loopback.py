"""Loopback /24s for a world's Service and pod addresses, leased across test processes.

Why: a world binds its ClusterIPs and pod IPs on loopback ranges (``127.64.X.0/24`` and ``127.65.X.``,
a move target ``127.66.X``/``127.67.X``). Picking X at random let two worlds in different pytest-xdist
workers pick the same one: in CI the second world's `kubernetes` Service listener (``127.64.177.1:443``)
was already bound, its cert-manager pods never reached the apiserver, and ``clusterctl init`` timed out.
So each X is leased with an exclusive ``flock`` under the fleet registry's run directory, held for the
world's life and dropped by the kernel when the process dies, however it dies.
"""

from __future__ import annotations

import fcntl
import os
import secrets

from capi_gpu_sim.hosts import names

OCTETS = range(1, 251)


class OctetLease:
    """An exclusive claim on one third octet of a loopback family (``"world"``, ``"move-target"``)."""

    def __init__(self, family: str) -> None:
        names.RUN_DIR.mkdir(parents=True, exist_ok=True)
        candidates = list(OCTETS)
        # Random order, so leftovers of a test that did not stop its world are stepped over quickly.
        start = secrets.randbelow(len(candidates))
        for octet in candidates[start:] + candidates[:start]:
            path = names.RUN_DIR / f"loopback-{family}-{octet}.lock"
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.octet, self._fd = octet, fd
            return
        raise RuntimeError(f"no free loopback octet for {family} (all {len(candidates)} held)")

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the only descriptor drops the lock
            self._fd = -1
