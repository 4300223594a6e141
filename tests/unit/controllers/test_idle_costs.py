"""Idle costs of the per-object loops: the fleet-shared Secrets are read once per TTL (concurrent misses
share the read, absence is cached too, a change shows after the TTL); each host's OS host key Secret is
read once per process; a wake-up that arrives during a
pass starts the next pass at once; a machine whose owner appeared is woken by its own event (an event
handler on our kind)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import kopf

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.host import HetznerGPUHost, HetznerGPUHostSpec
from capi_gpu.controllers import handlers, host_context, machine_loop
from capi_gpu.kube import Obj, Res
from capi_gpu.runtime import loops
from capi_gpu.runtime.deps import Deps, RobotClients, SecretCache
from capi_gpu.runtime.settings import Settings


class CountingKube:
    """What SecretCache uses of AsyncKube: get_or_none, counted, with a pause to let misses overlap."""

    def __init__(self, secrets: dict[str, Obj]) -> None:
        self.secrets, self.reads = secrets, 0

    async def get_or_none(self, res: Res, name: str, namespace: str | None = None) -> Obj | None:
        self.reads += 1
        await asyncio.sleep(0.01)
        return self.secrets.get(name)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_one_read_per_ttl_for_many_hosts() -> None:
    kube, clock = CountingKube({"robot-ssh": {"data": {"k": "djE="}}}), Clock()
    cache = SecretCache(ttl=10.0, now=clock)
    got = await asyncio.gather(*(cache.get(kube, "ns", "robot-ssh") for _ in range(100)))  # type: ignore[arg-type]
    assert kube.reads == 1 and all(g == {"data": {"k": "djE="}} for g in got)
    clock.t = 9.9
    await cache.get(kube, "ns", "robot-ssh")  # type: ignore[arg-type]
    assert kube.reads == 1
    kube.secrets["robot-ssh"] = {"data": {"k": "djI="}}  # rotated
    clock.t = 10.0
    assert await cache.get(kube, "ns", "robot-ssh") == {"data": {"k": "djI="}}  # type: ignore[arg-type]
    assert kube.reads == 2


async def test_absence_is_cached_and_creation_seen_after_ttl() -> None:
    kube, clock = CountingKube({}), Clock()
    cache = SecretCache(ttl=10.0, now=clock)
    assert await cache.get(kube, "ns", "robot-credentials") is None  # type: ignore[arg-type]
    kube.secrets["robot-credentials"] = {"data": {}}
    assert await cache.get(kube, "ns", "robot-credentials") is None  # type: ignore[arg-type]
    clock.t = 11.0
    assert await cache.get(kube, "ns", "robot-credentials") == {"data": {}}  # type: ignore[arg-type]
    assert await cache.get(kube, "other-ns", "robot-credentials") == {"data": {}}  # type: ignore[arg-type]
    assert kube.reads == 3


def test_robot_clients_cache_for_the_poll_interval() -> None:
    assert RobotClients(Settings()).secrets.ttl == 10.0
    assert RobotClients(Settings(timing_scale=60)).secrets.ttl == 10.0 / 60


class Running:
    def __bool__(self) -> bool:
        return False


async def test_wakeup_during_a_pass_is_not_lost() -> None:
    deps = Deps(None, Settings(), None, RobotClients(Settings()))  # type: ignore[arg-type]
    passes: list[float] = []
    done = asyncio.Event()

    async def reconcile(d: Deps, namespace: str, name: str) -> float | None:
        passes.append(asyncio.get_running_loop().time())
        if len(passes) == 1:
            d.wakeups.wake("machine", namespace, name)  # e.g. bootstrap data arrived mid-pass
            return 300.0
        done.set()
        return None

    task = asyncio.create_task(loops.run("machine", reconcile, deps, "ns", "m", Running()))
    await asyncio.wait_for(done.wait(), timeout=5)
    await task
    assert len(passes) == 2 and passes[1] - passes[0] < 1.0


def machine(owner: bool, reason: str | None) -> dict[str, Any]:
    refs = [{"kind": "Machine", "name": "m-0", "apiVersion": "cluster.x-k8s.io/v1beta2", "uid": "u"}] if owner else []
    conditions = [{"type": "Ready", "status": "False", "reason": reason}] if reason else []
    return {"metadata": {"name": "gpu-0", "ownerReferences": refs}, "status": {"conditions": conditions}}


def test_owner_arrived_only_while_the_status_still_waits_for_it() -> None:
    assert machine_loop.owner_arrived(machine(True, c.Reason.WAITING_FOR_MACHINE_OWNER))
    assert not machine_loop.owner_arrived(machine(False, c.Reason.WAITING_FOR_MACHINE_OWNER))
    assert not machine_loop.owner_arrived(machine(True, c.Reason.WAITING_FOR_BOOTSTRAP_DATA))
    assert not machine_loop.owner_arrived(machine(True, None))
    assert not machine_loop.owner_arrived({"metadata": {}})


def test_machine_owner_event_is_registered() -> None:
    registry = kopf.OperatorRegistry()

    def no_deps() -> Deps:
        raise AssertionError("not started")

    handlers.register(registry, Settings(), no_deps)
    watchers = {h.id: str(h.selector.any_name) for h in registry._watching.get_all_handlers()}
    assert watchers["machine-owner"] == "hetznergpumachines"


class OSKeyKube(CountingKube):
    """get_or_none counted (CountingKube) and create recording the Secret, as ensure_os_hostkey uses them."""

    async def create(self, res: Res, body: Obj, namespace: str | None = None) -> Obj:
        data = {k: base64.b64encode(v.encode()).decode() for k, v in body["stringData"].items()}
        self.secrets[body["metadata"]["name"]] = {"metadata": body["metadata"], "data": data}
        return body


async def test_the_os_host_key_secret_is_read_once_per_host() -> None:
    kube = OSKeyKube({})
    deps = Deps(kube, Settings(), None, RobotClients(Settings()))  # type: ignore[arg-type]
    host = HetznerGPUHost(metadata={"name": "gex-a", "uid": "u1"}, spec=HetznerGPUHostSpec(server_number=1))
    made = await host_context.ensure_os_hostkey(deps, host, "ns")  # generated and stored: one miss
    again = [await host_context.ensure_os_hostkey(deps, host, "ns") for _ in range(5)]
    assert kube.reads == 1 and all(k == made for k in again)
    # A new operator process reads it back from the Secret, once.
    fresh = Deps(kube, Settings(), None, RobotClients(Settings()))  # type: ignore[arg-type]
    assert await host_context.ensure_os_hostkey(fresh, host, "ns") == made
    await host_context.ensure_os_hostkey(fresh, host, "ns")
    assert kube.reads == 2
    # A host recreated under the same name (another uid) is not handed the old host's key from memory.
    del kube.secrets["gex-a" + domain.OS_HOSTKEY_SECRET_SUFFIX]
    other = HetznerGPUHost(metadata={"name": "gex-a", "uid": "u2"}, spec=HetznerGPUHostSpec(server_number=1))
    assert await host_context.ensure_os_hostkey(fresh, other, "ns") != made
    assert kube.reads == 3
