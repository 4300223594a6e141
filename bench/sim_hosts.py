"""Figures for the simulated GEX131 hosts: rootfs build, boot time per mode, memory per host, teardown.

Run as root: ``.venv/bin/python bench/sim_hosts.py [--hosts 3] [--cold]``. ``--cold`` builds the
debootstrap tree into a fresh cache directory (about a minute and ~210 MB, needs the Debian mirror);
without it the cached tree is used and its build is reported as cached.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from capi_gpu_sim.fleet import Fleet, FleetConfig
from capi_gpu_sim.hosts import keys, rootfs, targets
from capi_gpu_sim.hosts.host import Host, HostConfig, Running


def _ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    med, lo, hi = (statistics.median(values) * 1000, min(values) * 1000, max(values) * 1000)
    return f"median {med:.0f} ms (min {lo:.0f}, max {hi:.0f})"


def _rescue(host: Host, key: keys.KeyPair) -> None:
    before = host.boot_count()
    host.reset("hw", targets.RescueBoot((key.public_line,), (keys.generate().private_openssh,)))
    if not host.wait_up(60, after_boot=before):
        raise SystemExit(f"{host.name}: rescue did not come up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="build the debootstrap tree from scratch")
    args = parser.parse_args()
    if args.cold:
        with tempfile.TemporaryDirectory(prefix="capi-gpu-rootfs-") as tmp:
            report = rootfs.ensure_rootfs(root=Path(tmp))
            print(f"debootstrap cold: {report.seconds:.1f} s, {report.size_bytes / 1e6:.0f} MB")
    started = time.monotonic()
    config = FleetConfig(hosts=args.hosts, host=HostConfig(reset_seconds=0, reboot_seconds=0))
    with Fleet(config) as fleet:
        hosts = list(fleet.hosts.values())
        for h in hosts:
            h.wait_up(60)
        print(f"fleet of {args.hosts} up (systemd, previous OS) in {time.monotonic() - started:.1f} s")
        systemd = [b.up_after_s for h in hosts for b in h.boots if b.up_after_s and b.running is Running.PREVIOUS]
        time.sleep(3)  # let systemd settle before measuring memory
        print(f"systemd-mode boot to sshd: {_ms([s for s in systemd if s])}")
        print(f"memory per host, systemd idle: {statistics.mean(h.rss_bytes() for h in hosts) / 1e6:.0f} MB RSS")
        key = keys.generate()
        for h in hosts:
            _rescue(h, key)
        rescue = [h.boots[-1].up_after_s or 0.0 for h in hosts]
        print(f"rescue-mode boot to sshd: {_ms(rescue)}")
        print(f"memory per host, rescue (sshd) idle: {statistics.mean(h.rss_bytes() for h in hosts) / 1e6:.1f} MB RSS")
        t0 = time.monotonic()
    print(f"teardown of {args.hosts} hosts: {time.monotonic() - t0:.2f} s")
    cached = rootfs.ensure_rootfs()
    print(f"rootfs in use: {cached.path} ({rootfs.tree_size(cached.path) / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
