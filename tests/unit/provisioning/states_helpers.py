"""Builders for state-machine table tests: a host in a given state/step, observations, a fixed clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from capi_gpu.api.host import (
    HetznerGPUHost,
    HetznerGPUHostSpec,
    HetznerGPUHostStatus,
    HostKeys,
    HostState,
    Operation,
    RescueHostKey,
    Step,
)
from capi_gpu.provisioning import states, transitions
from capi_gpu.provisioning.model import Observations, ServerFacts, SSHOutcome, SSHProbe, Timing

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
TIMING = Timing()
RESCUE_KEY = RescueHostKey(type="ED25519", fingerprint="aa:" * 15 + "aa")
SERVER = ServerFacts(
    number=7, name="gex131-7", ipv4="10.231.0.2", ipv6=None, datacenter="FSN1-DC14", product="GEX131", status="ready"
)


def host(
    state: HostState = HostState.REGISTERING,
    step: Step | None = None,
    started: timedelta | None = None,
    ops: list[tuple[str, timedelta, str | None]] | None = None,
    spec: dict[str, Any] | None = None,
    **status: Any,
) -> HetznerGPUHost:
    """ops: (name, requested this long before T0, outcome); the step started just before the oldest op."""
    if started is None and step is not None:
        started = max((ago for _, ago, _ in ops or []), default=timedelta(0)) + timedelta(seconds=1)
    st = HetznerGPUHostStatus(
        state=state,
        step=step,
        step_started_at=(T0 - started) if started is not None else (T0 if step else None),
        reset_types=["sw", "hw", "man"],
        **status,
    )
    st.operations = [
        Operation(name=n, requested_at=T0 - ago, outcome=o, completed_at=None if o is None else T0 - ago)
        for n, ago, o in ops or []
    ]
    return HetznerGPUHost(spec=HetznerGPUHostSpec(server_number=7, **(spec or {})), status=st)


def with_keys(h: HetznerGPUHost, rescue: bool = True, os: bool = False) -> HetznerGPUHost:
    h.status.host_keys = HostKeys(rescue=[RESCUE_KEY] if rescue else [], os="ssh-ed25519 AAAAos" if os else None)
    return h


def ssh(
    outcome: SSHOutcome = SSHOutcome.OK, hostname: str | None = "rescue", boot_id: str | None = "b2", **kw: Any
) -> SSHProbe:
    return SSHProbe(outcome, hostname=hostname, boot_id=boot_id, **kw)


def decide(h: HetznerGPUHost, obs: Observations | None = None, now: datetime = T0, **ctx: Any) -> states.Decision:
    c = transitions.Context(host=h, obs=obs or Observations(), now=now, timing=TIMING, hostname="bm-gpu-0", **ctx)
    return states.decide(c)


def context(h: HetznerGPUHost, obs: Observations | None = None, now: datetime = T0, **ctx: Any) -> transitions.Context:
    return transitions.Context(host=h, obs=obs or Observations(), now=now, timing=TIMING, hostname="bm-gpu-0", **ctx)
