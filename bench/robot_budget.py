"""Robot budget under a 100-host scale-up: calls per node, peak hourly use per family, 403s.

The real ``RobotClient`` and account budget talk over HTTP to the Robot simulator, whose clock runs
``--compression`` times faster than real time; the budget uses the simulator's clock, so both agree
on what an hour is. Each host runs the Robot part of a provisioning flow as a controller would,
requeueing (``await`` the ``retry_after``, never a busy loop) when the budget defers:

1. status from the account-wide ``GET /server`` cache (and again every 60 s while it waits);
2. ensure the rescue SSH key (one lookup per process, not per host);
3. rescue activation (an old activation is deleted first: 10 % of the servers have one);
4. ``GET /reset/{n}`` for the types, then ``POST /reset/{n}`` type ``hw``;
5. wait for the rescue boot (330 s, CAPH PR #1946), then ``GET /boot/{n}/rescue`` (consumed?);
6. installimage (600 s) and the SSH reboot into the OS (330 s): no Robot calls, only status polls;
7. ``POST /server/{n}`` to rename the server after the node.

Counts come from the simulator's request log (what Robot would have seen), not from the client.

    .venv/bin/python bench/robot_budget.py [--hosts 100] [--compression 600]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from prometheus_client import CollectorRegistry

from capi_gpu.hetzner import account, budget, errors, models, robot
from capi_gpu_sim.robot import RobotSim
from capi_gpu_sim.robot_world import Form

T = TypeVar("T")

RESCUE_BOOT_S = 330.0
INSTALL_S = 600.0
REBOOT_S = 330.0
STATUS_POLL_S = 60.0


class Host:
    def __init__(self, number: int, client: robot.RobotClient, sim: RobotSim, public_key: str) -> None:
        self.number, self.client, self.sim, self.public_key = number, client, sim, public_key
        self.deferrals = 0

    async def sleep(self, sim_seconds: float) -> None:
        await asyncio.sleep(self.sim.clock.real_seconds(sim_seconds))

    async def step(self, call: Callable[[], Awaitable[T]]) -> T:
        """One reconcile step: on "not yet" wait out the delay, as kopf's TemporaryError(delay) would."""
        while True:
            try:
                return await call()
            except errors.RobotRequeue as exc:
                self.deferrals += 1
                await self.sleep(exc.retry_after)

    async def wait(self, sim_seconds: float) -> None:
        """Wait for SSH-side work while the controller keeps refreshing status from the cache."""
        deadline = self.sim.clock.now() + sim_seconds
        while self.sim.clock.now() < deadline:
            await self.step(lambda: self.client.cached_server(self.number))
            await self.sleep(min(STATUS_POLL_S, max(deadline - self.sim.clock.now(), 0.0)))

    async def provision(self) -> float:
        server = await self.step(lambda: self.client.cached_server(self.number))
        assert server.status is models.ServerStatus.READY
        fingerprint = await self.step(lambda: self.client.ensure_key("capi-gpu-rescue", self.public_key))
        await self.step(lambda: self.client.enable_rescue(self.number, [fingerprint]))
        options = await self.step(lambda: self.client.get_reset(self.number))
        assert options.supports(models.ResetType.HARDWARE)
        await self.step(lambda: self.client.reset(self.number, models.ResetType.HARDWARE))
        await self.wait(RESCUE_BOOT_S)
        rescue = await self.step(lambda: self.client.get_rescue(self.number))
        assert not rescue.active, "the reset should have consumed the rescue activation"
        await self.wait(INSTALL_S + REBOOT_S)
        await self.step(lambda: self.client.rename_server(self.number, f"gpu-node-{self.number}"))
        return self.sim.clock.now()


def peak_in_window(times: list[float], window: float) -> int:
    return max((bisect.bisect_left(times, t + window) - i for i, t in enumerate(times)), default=0)


def public_key() -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode() + " bench"


async def scale_up(sim: RobotSim, hosts: int) -> dict[str, Any]:
    registry = account.AccountRegistry(clock=sim.clock.now, prometheus=CollectorRegistry())

    async def sim_sleep(seconds: float) -> None:
        await asyncio.sleep(sim.clock.real_seconds(seconds))

    numbers = [sim.add_server() for _ in range(hosts)]
    with sim.locked() as world:  # some servers still carry an old rescue activation
        for number in numbers[::10]:
            world.activate_rescue(str(number), Form({"os": ["linux"]}))
    started_real, started_sim = time.monotonic(), sim.clock.now()
    async with robot.RobotClient(
        sim.username, sim.password, base_url=sim.url, registry=registry, sleep=sim_sleep
    ) as client:
        key = public_key()
        fleet = [Host(number, client, sim, key) for number in numbers]
        finished = await asyncio.gather(*(host.provision() for host in fleet))
    return {
        "makespan_sim_h": round((max(finished) - started_sim) / 3600, 3),
        "real_s": round(time.monotonic() - started_real, 2),
        "deferrals": sum(host.deferrals for host in fleet),
    }


def measure(sim: RobotSim, hosts: int, run: dict[str, Any]) -> dict[str, Any]:
    log = [e for e in sim.log if e.endpoint is not None]
    by_family: dict[budget.Family, list[float]] = defaultdict(list)
    for entry in log:
        by_family[budget.family_for(entry.method, entry.path)].append(entry.t)
    peaks = {}
    for family, times in sorted(by_family.items()):
        limit = budget.DEFAULT_LIMITS[family]
        peak = peak_in_window(sorted(times), limit.window_s)
        peaks[family.value] = {
            "calls": len(times),
            "peak_in_window": peak,
            "limit": limit.max_requests,
            "window_s": int(limit.window_s),
            "peak_fraction": round(peak / limit.max_requests, 3),
        }
    statuses = Counter(e.status for e in sim.log)
    return {
        "bench": "robot_budget",
        "hosts": hosts,
        "compression": sim.clock.compression,
        "robot_calls": len(sim.log),
        "calls_per_node": round(len(sim.log) / hosts, 2),
        "http_403": statuses.get(403, 0),
        "http_401": statuses.get(401, 0),
        "families": peaks,
        **run,
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['hosts']} hosts, compression {result['compression']:g}x, "
          f"makespan {result['makespan_sim_h']} sim h ({result['real_s']} s real)")  # fmt: skip
    print(f"Robot calls {result['robot_calls']} = {result['calls_per_node']} per node; "
          f"403s {result['http_403']}; budget deferrals {result['deferrals']}")  # fmt: skip
    print(f"\n{'FAMILY':<15}{'CALLS':>7}{'PEAK':>7}{'LIMIT':>8}{'WINDOW':>8}{'USE':>8}")
    for family, row in result["families"].items():
        window = "1d" if row["window_s"] == 86400 else "1h"
        print(f"{family:<15}{row['calls']:>7}{row['peak_in_window']:>7}{row['limit']:>8}{window:>8}"
              f"{row['peak_fraction']:>8.0%}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--compression", type=float, default=600.0, help="sim seconds per real second")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with RobotSim(compression=args.compression, seed=args.seed) as sim:
        run = asyncio.run(scale_up(sim, args.hosts))
        result = measure(sim, args.hosts, run)
    print(json.dumps(result, separators=(",", ":")))
    print_table(result)


if __name__ == "__main__":
    main()
