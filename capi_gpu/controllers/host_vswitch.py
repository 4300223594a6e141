"""A host's place on its cluster's vSwitch, once per host pass (docs/private-network.md, steps 2-6).

Claim: the address is allocated (``private_network.allocate``) and recorded on the host before anything is
sent, under an account lock per vSwitch, so two hosts of one process never pick the same address. Join and
leave: every host's record says whether its server should be on the vSwitch (``vswitch_steps.desired``), and
whichever host's pass comes first sends the one batched change ``vswitch_plan.next_change`` asks for, after
a short gathering window, so hosts claimed together join in one ``POST``. The vSwitch is read once per
vSwitch per pass of the fleet (``RobotClient.cached_vswitch``). Leaving is written (``Leaving``) before the
remove is sent, and the record is dropped only once Robot shows the server gone, which frees the address.
A host whose claim is on a cluster without ``spec.privateNetwork``, and which holds no record, costs no
vSwitch call at all. The decisions are pure (``vswitch_steps``, ``vswitch_plan``); this module does the I/O.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.cluster import HetznerGPUCluster
from capi_gpu.api.host import HetznerGPUHost
from capi_gpu.api.network import HostPrivateNetwork, PrivateNetworkSpec, VSwitchMembership
from capi_gpu.controllers import host_move
from capi_gpu.controllers.host_context import HOSTS, Consumer, HostEnv, hostname
from capi_gpu.hetzner import errors as robot_errors
from capi_gpu.hetzner import vswitch_plan
from capi_gpu.kube import Conflict, Obj, ours
from capi_gpu.provisioning import move, private_network, vswitch_steps
from capi_gpu.runtime import events, pause
from capi_gpu.runtime.deps import AccessError, Deps

log = logging.getLogger(__name__)
CLUSTERS = ours("hetznergpuclusters")
M = VSwitchMembership
GATHER_S = 3.0
"""How long an add waits for more hosts to join it: a scale-up claims its hosts within a moment, and one
``POST`` for all of them costs one write token (100/h for the account) and one settle time, not one each."""
REFUSED_REST_S = 600.0
"""How long a vSwitch rests after Robot refused a change for good (the condition says why), instead of
sending the same refused request every pass, each for one of the account's 100 vSwitch writes per hour."""
_RETRYABLE = (robot_errors.RobotRequeue, robot_errors.RobotTransientError, robot_errors.RobotAuthError)


@dataclass(frozen=True)
class Claim:
    spec: PrivateNetworkSpec
    vswitch_id: int | None  # None: the cluster has not recorded its vSwitch yet
    vlan: int | None


@dataclass
class _Pass:
    host: HetznerGPUHost
    problem: tuple[str, str] | None = None  # condition reason and message


async def cluster_claim(deps: Deps, consumer: Consumer, namespace: str) -> tuple[bool, Claim | None]:
    """(known, claim): the private network of the HetznerGPUCluster whose Cluster the claiming machine is
    in. Not known when that HetznerGPUCluster isn't there (a move delivers it): then nothing is decided."""
    meta = consumer.machine.metadata
    labels = meta.get("labels")
    cluster = labels.get(domain.CLUSTER_NAME_LABEL) if isinstance(labels, dict) else None
    ns = str(meta.get("namespace") or namespace)
    for obj in await deps.kube.list(CLUSTERS, ns):
        owners = obj["metadata"].get("ownerReferences") or []
        if not any(o.get("kind") == "Cluster" and o.get("name") == cluster for o in owners):
            continue
        hgc = HetznerGPUCluster.model_validate(obj)
        spec = hgc.spec.private_network
        if spec is None:
            return True, None
        recorded = hgc.status.private_network
        vswitch_id = spec.vswitch.id or (recorded.vswitch_id if recorded else None)
        # A vSwitch we create has the spec's VLAN; one named by id has the VLAN the cluster read from Robot.
        vlan = spec.vswitch.vlan or (recorded.vlan if recorded and recorded.vswitch_id == vswitch_id else None)
        return True, Claim(spec, vswitch_id, vlan)
    return False, None


async def sync(
    deps: Deps, obj: Obj, host: HetznerGPUHost, env: HostEnv
) -> tuple[HetznerGPUHost, HostEnv, vswitch_steps.Gates]:
    """One pass: record, join or leave as the host's claim says; returns the host as written, the env with the
    VLAN interface Configure writes, and what Bootstrap and Deprovisioning wait for. Raises ``AccessError``
    when another writer changed the host meanwhile (nothing was sent)."""
    ns = obj["metadata"]["namespace"]
    consumer = env.consumer
    claimed = consumer is not None and not consumer.standby
    if not claimed and host.status.private_network is None:
        return host, env, vswitch_steps.Gates()
    claim: Claim | None = None
    if consumer is not None and claimed:
        known, claim = await cluster_claim(deps, consumer, ns)
        if not known:
            return host, env, vswitch_steps.gates(host.status, _recorded(host))
    if claim is None and host.status.private_network is None:
        return host, env, vswitch_steps.Gates()
    wanted = claim.vswitch_id if claim is not None else None
    if claim is not None and wanted is None:
        why = "waiting for the cluster to record its vSwitch"
        _waiting(deps, host, why)
        return host, env, vswitch_steps.Gates(before_join=why, before_configure=why, configure=True)
    state = _Pass(host)
    if claim is not None and vswitch_steps.should_allocate(host.status, wanted):
        await _allocate(deps, env, state, ns, claim)
    record = state.host.status.private_network
    if (
        record is not None
        and record.membership is not M.LEAVING
        and vswitch_steps.should_leave(state.host.status, wanted)
    ):
        await _write_record(deps, state, ns, record.model_copy(update={"membership": M.LEAVING}))
        events.emit(obj, "LeavingVSwitch", f"server {host.spec.server_number} leaves vSwitch {record.vswitch_id}")
    if state.host.status.private_network is not None:
        await _membership(deps, env, state, ns)
    _condition(deps, obj, state, claim)
    record = state.host.status.private_network
    if claim is not None and claim.vlan is not None and record is not None and record.vswitch_id == wanted:
        allocated = private_network.Allocated(ipaddress.IPv4Address(record.address), claim.spec.network())
        env = dataclasses.replace(
            env, private_network=private_network.vlan_interface(claim.spec, claim.vlan, allocated)
        )
    gates = vswitch_steps.gates(state.host.status, wanted)
    if claim is not None:
        before = vswitch_steps.before_configure(state.host.status, wanted, claim.vlan)
        gates = dataclasses.replace(gates, before_configure=before, configure=True)
    return state.host, env, gates


def _waiting(deps: Deps, host: HetznerGPUHost, why: str) -> None:
    """PrivateNetworkReady False while the claim's cluster has not recorded its vSwitch: Configure and the
    join wait for it, and the host says why (no Event: the cluster's own condition says what holds it)."""
    conds = c.set_condition(
        host.status.conditions, c.Type.PRIVATE_NETWORK_READY, False, c.Reason.JOINING_VSWITCH, why, deps.clock()
    )
    host.status.conditions = conds


def _recorded(host: HetznerGPUHost) -> int | None:
    record = host.status.private_network
    return record.vswitch_id if record is not None and record.membership is not M.LEAVING else None


async def _allocate(deps: Deps, env: HostEnv, state: _Pass, ns: str, claim: Claim) -> None:
    assert claim.vswitch_id is not None
    owner = f"{ns}/{hostname(state.host)}"
    async with env.robot.account.lock(f"vswitch-address/{claim.vswitch_id}"):
        held = private_network.held_by_hosts(await deps.kube.list(HOSTS), claim.vswitch_id)
        got = private_network.allocate(claim.spec, held, owner)
        if isinstance(got, private_network.Exhausted):
            state.problem = (got.reason.value, got.message)
            return
        record = HostPrivateNetwork(vswitch_id=claim.vswitch_id, address=str(got.address), membership=M.ABSENT)
        await _write_record(deps, state, ns, record)
    log.info("host %s: address %s on vSwitch %s", owner, got.address, claim.vswitch_id)


async def _write_record(deps: Deps, state: _Pass, ns: str, record: HostPrivateNetwork | None) -> None:
    """The record alone, against the resourceVersion read: it must be written before what depends on it is
    sent (an address before the join, Leaving before the remove)."""
    host = state.host
    body: Obj = {
        "status": {"privateNetwork": record.model_dump(by_alias=True, mode="json") if record is not None else None},
        "metadata": {"resourceVersion": host.metadata.get("resourceVersion")},
    }
    try:
        written = await deps.kube.patch(HOSTS, hostname(host), body, ns, sub="status")
    except Conflict as exc:
        raise AccessError(move.Reason.CONSUMER_CHANGED, "host changed while writing its private network") from exc
    host = host_move.versioned(host, written)
    state.host = host.model_copy(update={"status": host.status.model_copy(update={"private_network": record})})


async def _membership(deps: Deps, env: HostEnv, state: _Pass, ns: str) -> None:
    """Read the vSwitch (shared), send the batched change if one is due, and bring this host's record up to
    date: its membership, or the record dropped once a leaving server is gone."""
    record = state.host.status.private_network
    assert record is not None
    number, leaving = state.host.spec.server_number, record.membership is M.LEAVING
    async with env.robot.account.lock(f"vswitch-change/{record.vswitch_id}"):
        try:
            vswitch = await env.robot.cached_vswitch(record.vswitch_id)
        except robot_errors.RobotNotFound as exc:
            if leaving:  # the vSwitch itself is gone: nothing left to leave
                await _write_record(deps, state, ns, None)
            else:
                state.problem = (c.Reason.VSWITCH_NOT_FOUND, f"vSwitch {record.vswitch_id}: {exc}")
            return
        except _RETRYABLE as exc:
            log.info("host %s: vSwitch %s not read: %s", hostname(state.host), record.vswitch_id, exc)
            return
        except robot_errors.RobotTerminalError as exc:
            state.problem = (c.Reason.VSWITCH_REFUSED, f"vSwitch {record.vswitch_id}: {exc}")
            return
        hosts = await deps.kube.list(HOSTS)
        paused = await _paused(deps, vswitch_steps.on_vswitch(hosts, record.vswitch_id))
        join, leave = vswitch_steps.desired(hosts, record.vswitch_id, paused)
        change = vswitch_plan.next_change(vswitch, join, leave)
        if change.action is vswitch_plan.Action.ADD:
            try:
                counts = await _memberships(env, record.vswitch_id, change.servers)
            except _RETRYABLE as exc:
                log.info("host %s: vSwitch memberships not read: %s", hostname(state.host), exc)
                return
            change = vswitch_plan.next_change(vswitch, join, leave, counts)
        if number in change.refused:
            verdict = change.refused[number]
            state.problem = (verdict.reason.value, verdict.message)
        sent = await _send(env, state, record.vswitch_id, change)
    if sent and number in change.servers:
        now = M.LEAVING if change.action is vswitch_plan.Action.REMOVE and leaving else M.JOINING
    else:
        now = vswitch_plan.membership(vswitch, number, leaving=leaving)
    if leaving and now is M.ABSENT:
        await _write_record(deps, state, ns, None)  # off the vSwitch: the address is free again
        return
    if leaving:
        now = M.LEAVING
    if now is not record.membership:
        await _write_record(deps, state, ns, record.model_copy(update={"membership": now}))


async def _paused(deps: Deps, hosts: Iterable[Mapping[str, Any]]) -> frozenset[tuple[str, str]]:
    """The hosts (namespace, name) that are paused by ``runtime.pause``'s rule, on what each host records of
    its cluster (the consumer-cluster label written at the claim, as the host loop's own pause reads it):
    a move's source must stay still, and another cluster sharing the vSwitch must not add or remove them."""
    clusters: dict[tuple[str, str], bool] = {}
    out: set[tuple[str, str]] = set()
    for host in hosts:
        meta = host.get("metadata") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        cluster = (meta.get("labels") or {}).get(domain.CONSUMER_CLUSTER_LABEL)
        if cluster and (ns, cluster) not in clusters:
            clusters[(ns, cluster)] = await pause.cluster_paused(deps, ns, cluster)
        if pause.annotated(dict(host)) or (cluster and clusters[(ns, cluster)]):
            out.add((ns, name))
    return frozenset(out)


async def _memberships(env: HostEnv, vswitch_id: int, servers: tuple[int, ...]) -> dict[int, int]:
    """Each joining server's count on the account's other vSwitches, so that Robot's 5-per-server limit is a
    condition before the add is sent (not a 409 after it). Read only when an add is due: ``GET /vswitch`` and
    each other vSwitch's members, all through the account's short shared caches."""
    reads = []
    for listed in await env.robot.cached_vswitch_list():
        if listed.id == vswitch_id:
            continue
        try:
            reads.append(await env.robot.cached_vswitch(listed.id))
        except robot_errors.RobotNotFound:  # gone since the list was read: it holds nobody
            continue
    return {number: vswitch_plan.memberships(reads, number) for number in servers}


async def _send(env: HostEnv, state: _Pass, vswitch_id: int, change: vswitch_plan.Change) -> bool:
    """The change, if one is due and its gathering window is over; True when it was sent."""
    acct, action = env.robot.account, change.action
    if action not in (vswitch_plan.Action.ADD, vswitch_plan.Action.REMOVE):
        acct.vswitch_gathering.pop(vswitch_id, None)
        return False
    since = acct.vswitch_gathering.setdefault(vswitch_id, acct.clock())
    if acct.clock() - since < (GATHER_S if action is vswitch_plan.Action.ADD else 0.0):
        return False  # gathering (an add), or resting after a refusal (whose "since" lies ahead)
    acct.vswitch_gathering.pop(vswitch_id, None)
    try:
        if action is vswitch_plan.Action.ADD:
            await env.robot.add_vswitch_servers(vswitch_id, change.servers)
        else:
            await env.robot.remove_vswitch_servers(vswitch_id, change.servers)
    except _RETRYABLE as exc:  # IN_PROCESS (another tool's change), the budget, Robot down: next pass
        log.info("vSwitch %s: %s %s deferred: %s", vswitch_id, action.value, change.servers, exc)
        return False
    except robot_errors.RobotTerminalError as exc:
        # A refusal a read could not foresee (a server without vSwitch support, 5 vSwitches per server): the
        # same request would be refused again, each time for a write token, so the vSwitch rests a while.
        acct.vswitch_gathering[vswitch_id] = acct.clock() + REFUSED_REST_S
        why = f"vSwitch {vswitch_id}: {action.value} {list(change.servers)}: {exc}"
        state.problem = (c.Reason.VSWITCH_REFUSED, why)
        return False
    log.info("vSwitch %s: %s %s sent", vswitch_id, action.value, list(change.servers))
    return True


def _condition(deps: Deps, obj: Obj, state: _Pass, claim: Claim | None) -> None:
    """PrivateNetworkReady on the host: why it waits or is refused (with an Event when the reason changes)."""
    host, record = state.host, state.host.status.private_network
    if state.problem is not None:
        ok, (reason, message) = False, state.problem
    elif record is None:
        ok, reason, message = True, c.Reason.READY, "not on a vSwitch"
    elif record.membership is M.LEAVING:
        ok, reason, message = False, c.Reason.LEAVING_VSWITCH, f"leaving vSwitch {record.vswitch_id}"
    elif record.membership is M.READY:
        ok, reason, message = True, c.Reason.READY, f"{record.address} on vSwitch {record.vswitch_id}"
    else:
        membership = record.membership.value
        ok, reason, message = (
            False,
            c.Reason.JOINING_VSWITCH,
            f"{record.address}: vSwitch {record.vswitch_id} {membership}",
        )
    if claim is None and record is None and state.problem is None:
        return
    before = c.get(host.status.conditions, c.Type.PRIVATE_NETWORK_READY)
    resting = before is not None and before.reason == c.Reason.VSWITCH_REFUSED and record is not None
    if resting and state.problem is None and record is not None and record.membership is M.ABSENT:
        return  # the refusal still stands while the vSwitch rests (nothing was sent since)
    conds = c.set_condition(host.status.conditions, c.Type.PRIVATE_NETWORK_READY, ok, reason, message, deps.clock())
    host.status.conditions = conds
    if not ok and state.problem is not None and (before is None or before.reason != str(reason)):
        events.emit(obj, str(reason), message, warning=True)
