"""The Robot simulator's vSwitches: private layer-2 networks between an account's dedicated servers.

Answers are unwrapped (the one documented deviation from Robot's ``{"name": {...}}`` bodies). What the
doc says, and what this enforces:

- ``vlan`` is 4000-4091 and unique in the account (409 ``VSWITCH_VLAN_NOT_UNIQUE``); an account holds at
  most ``account_limit`` vSwitches (409 ``VSWITCH_LIMIT_REACHED``; the doc gives no figure, 10 here);
- at most 100 servers per vSwitch (409 ``VSWITCH_SERVER_LIMIT_REACHED``) and 5 vSwitches per server
  (409 ``VSWITCH_PER_SERVER_LIMIT_REACHED``); a server without vSwitch support gets 404
  ``VSWITCH_NOT_AVAILABLE``; an unknown vSwitch 404 ``NOT_FOUND``.

Membership is asynchronous, as on Robot: an added server is ``processing`` (what the API sends; the doc
says "in process") for ``delay_s`` sim seconds, then ``ready`` (or ``failed`` under the ``vswitch_fail``
fault); a removed one stays listed as ``processing`` for ``delay_s``, then is gone. Sim seconds run at
the clock's compression, like every other delay of the simulator. While any member is ``processing``,
every change to that vSwitch (members, name/vlan, cancellation) is 409 ``VSWITCH_IN_PROCESS``.

Choices where the doc is silent, strict so a client cannot lean on leniency: adding a server that is
already a member, or removing one that is not, is 409 ``CONFLICT`` (read the vSwitch and adopt what it
says); a cancelled vSwitch refuses changes with 409 ``CONFLICT`` and keeps its VLAN and its members'
per-server counts while it is listed; a ``cancellation_date`` in the past is 400 ``INVALID_INPUT``.
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass, field
from typing import Any

from capi_gpu_sim.robot_world import ApiError, Form, RobotWorld, SimServer, invalid_input

VLAN_MIN, VLAN_MAX = 4000, 4091
SERVERS_PER_VSWITCH = 100
VSWITCHES_PER_SERVER = 5


@dataclass
class Member:
    server: SimServer
    status: str = "processing"
    leaving: bool = False

    def body(self) -> dict[str, Any]:
        return {**self.server.address(), "status": self.status}


@dataclass
class SimVSwitch:
    id: int
    name: str
    vlan: int
    cancelled: bool = False
    cancellation_date: str | None = None
    members: list[Member] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "vlan": self.vlan, "cancelled": self.cancelled}

    def detail(self) -> dict[str, Any]:
        # subnet/cloud_network are what Robot shows once an hcloud Network is coupled; the sim couples none.
        return {
            **self.summary(),
            "server": [m.body() for m in self.members],
            "subnet": [],
            "cloud_network": [],
        }

    def member(self, number: int) -> Member | None:
        return next((m for m in self.members if m.server.number == number), None)


class VSwitches:
    """The account's vSwitches. Not thread-safe by itself: ``robot.RobotSim`` holds its lock around calls."""

    def __init__(self, world: RobotWorld) -> None:
        self.world = world
        self.by_id: dict[int, SimVSwitch] = {}
        self.delay_s = 60.0  # sim seconds a join or a leave stays "processing"
        self.account_limit = 10
        self.fail: set[int] = set()  # servers whose joins end "failed" (SimFaults.vswitch_fail)
        self._ids = itertools.count(40000)

    # --- what the simulated fleet reads (the private link) ---------------------------------------

    def ready_members(self, vswitch_id: int) -> set[int]:
        """Server numbers whose port is configured: the hosts that share this vSwitch's private link."""
        vswitch = self.by_id.get(vswitch_id)
        if vswitch is None:
            return set()
        return {m.server.number for m in vswitch.members if m.status == "ready" and not m.leaving}

    # --- endpoints -----------------------------------------------------------------------------

    def list_all(self) -> tuple[int, Any]:
        return 200, [v.summary() for v in self.by_id.values()]

    def create(self, form: Form) -> tuple[int, Any]:
        name, vlan = form.required("name"), self._vlan(form)
        self._unique_vlan(vlan, None)
        if len(self.by_id) >= self.account_limit:
            raise ApiError(409, "VSWITCH_LIMIT_REACHED", "the account's vswitch limit is reached")
        vswitch = SimVSwitch(next(self._ids), name, vlan)
        self.by_id[vswitch.id] = vswitch
        return 201, vswitch.detail()

    def get(self, vid: str) -> tuple[int, Any]:
        return 200, self._find(vid).detail()

    def update(self, vid: str, form: Form) -> tuple[int, Any]:
        vswitch = self._changeable(vid)
        name, vlan = form.required("name"), self._vlan(form)
        self._unique_vlan(vlan, vswitch.id)
        vswitch.name, vswitch.vlan = name, vlan
        return 200, None

    def cancel(self, vid: str, form: Form) -> tuple[int, Any]:
        vswitch = self._changeable(vid)
        raw = form.required("cancellation_date")
        date = self.world.date() if raw == "now" else _date(raw)
        if date < self.world.date():
            raise invalid_input(invalid=["cancellation_date"])
        vswitch.cancelled, vswitch.cancellation_date = True, date.isoformat()
        return 200, None

    def add_servers(self, vid: str, form: Form) -> tuple[int, Any]:
        vswitch = self._changeable(vid)
        servers = self._servers(form)
        if any(vswitch.member(s.number) is not None for s in servers):
            raise ApiError(409, "CONFLICT", "a server is already on this vswitch")
        if any(not s.vswitch_capable for s in servers):
            raise ApiError(404, "VSWITCH_NOT_AVAILABLE", "vswitch is not available for this server")
        if len(vswitch.members) + len(servers) > SERVERS_PER_VSWITCH:
            raise ApiError(409, "VSWITCH_SERVER_LIMIT_REACHED", f"{SERVERS_PER_VSWITCH} servers per vswitch")
        for server in servers:
            if self.memberships(server.number) >= VSWITCHES_PER_SERVER:
                raise ApiError(409, "VSWITCH_PER_SERVER_LIMIT_REACHED", f"{VSWITCHES_PER_SERVER} vswitches per server")
        joining = [Member(server) for server in servers]
        vswitch.members.extend(joining)

        def settled() -> None:
            for member in joining:
                if member in vswitch.members:
                    member.status = "failed" if member.server.number in self.fail else "ready"

        self.world.schedule(self.delay_s, settled)
        return 201, None

    def remove_servers(self, vid: str, form: Form) -> tuple[int, Any]:
        vswitch = self._changeable(vid)
        leaving: list[Member] = []
        for server in self._servers(form):
            member = vswitch.member(server.number)
            if member is None or member.leaving:
                raise ApiError(409, "CONFLICT", f"server {server.number} is not on this vswitch")
            leaving.append(member)
        for member in leaving:
            member.status, member.leaving = "processing", True

        def gone() -> None:
            vswitch.members = [m for m in vswitch.members if m not in leaving]

        self.world.schedule(self.delay_s, gone)
        return 200, None

    # --- rules ---------------------------------------------------------------------------------

    def memberships(self, number: int) -> int:
        return sum(v.member(number) is not None for v in self.by_id.values())

    def _find(self, vid: str) -> SimVSwitch:
        if not vid.isdigit() or int(vid) not in self.by_id:
            raise ApiError(404, "NOT_FOUND", "vswitch not found")
        return self.by_id[int(vid)]

    def _changeable(self, vid: str) -> SimVSwitch:
        vswitch = self._find(vid)
        if vswitch.cancelled:
            raise ApiError(409, "CONFLICT", "the vswitch is cancelled")
        if any(m.status == "processing" for m in vswitch.members):
            raise ApiError(409, "VSWITCH_IN_PROCESS", "the vswitch is being updated")
        return vswitch

    def _servers(self, form: Form) -> list[SimServer]:
        refs = form.many("server")
        if not refs:
            raise invalid_input(missing=["server"])
        return [self.world.server(ref) for ref in refs]

    @staticmethod
    def _vlan(form: Form) -> int:
        raw = form.required("vlan")
        if not raw.isdigit() or not VLAN_MIN <= int(raw) <= VLAN_MAX:
            raise invalid_input(invalid=["vlan"])
        return int(raw)

    def _unique_vlan(self, vlan: int, own_id: int | None) -> None:
        if any(v.vlan == vlan and v.id != own_id for v in self.by_id.values()):
            raise ApiError(409, "VSWITCH_VLAN_NOT_UNIQUE", "the vlan is already used by another vswitch")


def _date(raw: str) -> dt.date:
    try:
        return dt.date.fromisoformat(raw)
    except ValueError as exc:
        raise invalid_input(invalid=["cancellation_date"]) from exc
