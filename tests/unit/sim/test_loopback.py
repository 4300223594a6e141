"""Loopback octet leases: two worlds, in one process or two, never get the same /24."""

from __future__ import annotations

import subprocess
import sys

from capi_gpu_sim.loopback import OctetLease

HOLD = """
import sys, time
from capi_gpu_sim.loopback import OctetLease
lease = OctetLease(sys.argv[1])
print(lease.octet, flush=True)
time.sleep(30)
"""


def test_leases_held_at_once_are_distinct_and_a_released_octet_is_free_again() -> None:
    leases = [OctetLease("unit-test") for _ in range(20)]
    try:
        assert len({lease.octet for lease in leases}) == 20
    finally:
        for lease in leases:
            lease.release()
    again = [OctetLease("unit-test") for _ in range(250)]  # every octet, so all 20 were freed
    for lease in again:
        lease.release()


def test_an_octet_held_by_another_process_is_never_handed_out_until_that_process_dies() -> None:
    with subprocess.Popen([sys.executable, "-c", HOLD, "unit-test-x"], stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None
            held = int(holder.stdout.readline())
            mine = [OctetLease("unit-test-x") for _ in range(249)]
            assert held not in {lease.octet for lease in mine}
            holder.kill()
            holder.wait(10)
            last = OctetLease("unit-test-x")  # the kernel dropped the dead holder's lock
            assert last.octet == held
            for lease in [*mine, last]:
                lease.release()
        finally:
            holder.kill()
