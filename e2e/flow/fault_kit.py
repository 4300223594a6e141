"""What the fault and security tests share: reading a host's status and Events, the Robot simulator's
request log by server, bounded waits with messages that say what was seen last, and the checks that a
Machine converged (provisioned, node joined with our providerID, CAPI nodeRef).

Why a module of its own: every fault test asserts two things, the converged state and what Robot was
asked, and each must read them the same way (a reset is a ``POST /reset/{n}`` that Robot accepted; an
activation is a ``POST /boot/{n}/rescue`` it accepted), or the assertions drift apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from capi_gpu import domain
from capi_gpu.kube import CAPI_MACHINES, EVENTS, NODES, SECRETS, ours
from capi_gpu_sim.robot import LogEntry
from capi_gpu_sim.world import World

T = TypeVar("T")
HOSTS = ours("hetznergpuhosts")
GPU_MACHINES = ours("hetznergpumachines")
CLUSTERS = ours("hetznergpuclusters")


def until(what: str, fn: Callable[[], T | None], timeout: float, world: World | None = None, every: float = 0.2) -> T:
    """``fn()`` once it is truthy; on timeout a message with ``what``, and where the world's hosts are."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        failure = world.operator_failure() if world is not None else None
        if failure is not None:
            raise AssertionError(f"{failure}, while waiting for {what}")
        if time.monotonic() > deadline:
            where = ""
            if world is not None:
                where = f"; hosts: {host_summary(world)}; dump: {world.dump()}"
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{where}")
        time.sleep(every)


def host_name(number: int) -> str:
    return f"gex131-{number}"


def host_obj(world: World, number: int) -> dict[str, Any]:
    return world.k.get(HOSTS, host_name(number), world.config.namespace)


def status(world: World, number: int) -> dict[str, Any]:
    return host_obj(world, number).get("status") or {}


def host_summary(world: World) -> list[str]:
    out = []
    for h in world.hosts():
        st = h.get("status") or {}
        err = f" {st.get('errorType')}: {(st.get('errorMessage') or '')[:160]}" if st.get("errorType") else ""
        out.append(f"{h['metadata']['name']}={st.get('state')}/{st.get('step')}{err}")
    return out


def ops(world: World, number: int, name: str | None = None) -> list[dict[str, Any]]:
    return [op for op in status(world, number).get("operations") or [] if name is None or op["name"] == name]


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == type_), None)


def events(world: World, name: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
    out = []
    for ev in world.k.list(EVENTS, world.config.namespace):
        inv = ev.get("involvedObject") or {}
        if (name is None or inv.get("name") == name) and (kind is None or inv.get("kind") == kind):
            out.append(ev)
    return out


def wait_event(world: World, name: str, reason: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The Events ``reason`` on object ``name``, once there is one (kopf posts Events in the background, so
    one can land a moment after the status write that caused it)."""
    return until(
        f"a {reason} Event on {name}",
        lambda: [e for e in events(world, name) if e.get("reason") == reason],
        timeout,
        world,
    )


# --- the Robot simulator's request log ------------------------------------------------------------


def robot_log(world: World, since: int = 0) -> list[LogEntry]:
    assert world.robot is not None
    return world.robot.log[since:]


def calls(world: World, number: int, method: str, prefix: str, since: int = 0) -> list[LogEntry]:
    """Requests about server ``number`` (``prefix`` "/reset", "/boot"...), whatever Robot answered."""
    path = f"{prefix}/{number}"
    return [e for e in robot_log(world, since) if e.method == method and e.path.split("?")[0].startswith(path)]


def accepted(entries: list[LogEntry]) -> list[LogEntry]:
    return [e for e in entries if 200 <= e.status < 300]


def resets(world: World, number: int, since: int = 0) -> list[LogEntry]:
    """Resets Robot performed for this server (accepted ``POST /reset/{n}``), in order."""
    return accepted(calls(world, number, "POST", "/reset", since))


def activations(world: World, number: int, since: int = 0) -> list[LogEntry]:
    """Rescue activations Robot accepted for this server."""
    return accepted(calls(world, number, "POST", "/boot", since))


def logins_refused(world: World, since: int = 0) -> list[LogEntry]:
    return [e for e in robot_log(world, since) if e.status == 401]


# --- convergence ------------------------------------------------------------------------------------


def claimed_host(world: World, machine: str) -> int | None:
    obj = world.k.get_or_none(GPU_MACHINES, machine, world.config.namespace)
    name = ((obj or {}).get("metadata", {}).get("annotations") or {}).get(domain.ANNOTATION_HOST)
    return int(name.rsplit("-", 1)[1]) if name else None


def gpu_machines(world: World) -> list[dict[str, Any]]:
    return world.k.list(GPU_MACHINES, world.config.namespace)


def machine_of(world: World, number: int) -> str | None:
    """The HetznerGPUMachine that claimed the host, from the host's consumerRef."""
    ref = (host_obj(world, number).get("spec") or {}).get("consumerRef")
    return ref.get("name") if ref else None


def wait_claimed(world: World, timeout: float = 60.0, exclude: set[int] | None = None) -> int:
    """The server number of a host a (new) HetznerGPUMachine claimed."""

    def claimed() -> int | None:
        for m in gpu_machines(world):
            n = claimed_host(world, m["metadata"]["name"])
            if n is not None and n not in (exclude or set()):
                return n
        return None

    return until("a HetznerGPUMachine to claim a host", claimed, timeout, world)


def converged(world: World, number: int) -> dict[str, Any] | None:
    """The host's Node once the whole chain holds: host Provisioned, HetznerGPUMachine provisioned with our
    providerID, the Node registered with it, CAPI's Machine pointing at the Node."""
    ns = world.config.namespace
    if status(world, number).get("state") != "Provisioned":
        return None
    machine = machine_of(world, number)
    hgm = world.k.get_or_none(GPU_MACHINES, machine, ns) if machine else None
    provider_id = f"{domain.PROVIDER_ID_PREFIX}{number}"
    if hgm is None or (hgm.get("spec") or {}).get("providerID") != provider_id:
        return None
    if not ((hgm.get("status") or {}).get("initialization") or {}).get("provisioned"):
        return None
    node = world.k.get_or_none(NODES, host_name(number))
    if node is None or (node.get("spec") or {}).get("providerID") != provider_id:
        return None
    owner = next((o for o in hgm["metadata"].get("ownerReferences", []) if o.get("kind") == "Machine"), None)
    capi = world.k.get_or_none(CAPI_MACHINES, owner["name"], ns) if owner else None
    if capi is None or ((capi.get("status") or {}).get("nodeRef") or {}).get("name") != host_name(number):
        return None
    return node


def scale_to_zero(world: World, timeout: float = 120.0) -> None:
    """Scale the GPU MachineDeployment to 0 and wait until every HetznerGPUMachine is gone."""
    world.scale(0)
    until("every HetznerGPUMachine deleted", lambda: not gpu_machines(world), timeout, world)


def secret_text(world: World, name: str, key: str) -> str:
    import base64

    data = world.k.get(SECRETS, name, world.config.namespace).get("data") or {}
    return base64.b64decode(data[key]).decode()
