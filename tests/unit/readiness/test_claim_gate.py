"""Claim gate decisions: bind, fail at once, wait within grace then fail, sticky outcomes, entry shape."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import nvidia_slices as nv
import pytest

from capi_gpu import domain
from capi_gpu.api.conditions import GateReason, PoolReason
from capi_gpu.readiness import decisions
from capi_gpu.readiness.decisions import GateOutcome

NODE = "gex131-a"
SHARE = "3f0c1c8e-2b9a-4f7e-a1d2-5c6b7a8e9f00"
ALLOCATED = datetime.datetime(2026, 9, 1, 12, 0, 0, tzinfo=datetime.UTC)
SOON = ALLOCATED + datetime.timedelta(seconds=20)
LATE = ALLOCATED + datetime.timedelta(seconds=61)
GPU_DEVICE = nv.mig_name("1g.24gb", 6)
EXPECTED = decisions.ExpectedPool(profiles={"1g.24gb": 2, "2g.48gb": 1})


def slices(devices: list[dict[str, Any]] | None = None, **kw: Any) -> list[dict[str, Any]]:
    return [nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED) if devices is None else devices, **kw)]


def world(raw: list[dict[str, Any]], expected: decisions.ExpectedPool = EXPECTED) -> tuple[Any, Any]:
    verdicts = {NODE: decisions.pool_verdict(raw, NODE, expected)}
    return verdicts, decisions.current_pools(raw, NODE)


def gate_result(*, bare: bool = False) -> dict[str, Any]:
    result = {"request": "gate", "driver": domain.GATE_DRIVER, "pool": NODE, "device": domain.GATE_DEVICE_NAME}
    if bare:
        return result
    return {
        **result,
        "shareID": SHARE,
        "bindingConditions": [domain.GATE_BINDING_CONDITION],
        "bindingFailureConditions": [domain.GATE_FAILURE_CONDITION],
    }


def claim(
    *,
    gpu: dict[str, Any] | None = None,
    gate: bool = True,
    bare: bool = False,
    devices: list[dict[str, Any]] | None = None,
    allocated: str | None = "2026-09-01T12:00:00Z",
) -> dict[str, Any]:
    results = [{"request": "mig", "driver": "gpu.nvidia.com", "pool": NODE, "device": GPU_DEVICE, **(gpu or {})}]
    if gate:
        results.append(gate_result(bare=bare))
    allocation: dict[str, Any] = {"devices": {"results": results}}
    if allocated:
        allocation["allocationTimestamp"] = allocated
    status: dict[str, Any] = {"allocation": allocation}
    if devices is not None:
        status["devices"] = devices
    meta = {"name": "c", "namespace": "t", "generation": 1, "creationTimestamp": "2026-09-01T11:59:00Z"}
    return {"metadata": meta, "status": status}


def gate_entry(condition_type: str, status: str = "True") -> dict[str, Any]:
    condition = {
        "type": condition_type,
        "status": status,
        "reason": "X",
        "message": "",
        "lastTransitionTime": "t0",
    }
    return {
        "driver": domain.GATE_DRIVER,
        "pool": NODE,
        "device": domain.GATE_DEVICE_NAME,
        "shareID": SHARE,
        "conditions": [condition],
    }


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    claim: dict[str, Any]
    slices: list[dict[str, Any]]
    now: datetime.datetime
    outcome: GateOutcome
    reason: GateReason | None = None
    expected: decisions.ExpectedPool = EXPECTED
    says: str = ""


TAINTED_POOL = slices([nv.mig_device("1g.24gb", 6, taints=[nv.xid_taint()]), *nv.layout_devices(nv.BALANCED[1:])])
CASES = [
    Case("ready-binds", claim(), slices(), SOON, GateOutcome.BIND, GateReason.GPU_READY),
    Case("no-gate-device", claim(gate=False), slices(), SOON, GateOutcome.NOT_GATED),
    # Allocated from the ready shape of the gate slice: the scheduler binds without waiting for anyone.
    Case("bare-gate-device", claim(bare=True), [], LATE, GateOutcome.NOT_GATED),
    Case("unallocated", {"metadata": {"name": "c"}, "status": {}}, slices(), SOON, GateOutcome.NOT_GATED),
    Case(
        "already-bound",
        claim(devices=[gate_entry(domain.GATE_BINDING_CONDITION)]),
        [],
        LATE,
        GateOutcome.SETTLED,
    ),
    Case(
        "already-failed",
        claim(devices=[gate_entry(domain.GATE_FAILURE_CONDITION)]),
        slices(),
        SOON,
        GateOutcome.SETTLED,
    ),
    Case(
        "binding-false-is-not-settled",
        claim(devices=[gate_entry(domain.GATE_BINDING_CONDITION, "False")]),
        slices(),
        SOON,
        GateOutcome.BIND,
        GateReason.GPU_READY,
    ),
    Case("no-slices-waits", claim(), [], SOON, GateOutcome.WAIT, GateReason.NODE_NOT_READY, says="NoSlices"),
    Case(
        "no-slices-then-fails",
        claim(),
        [],
        LATE,
        GateOutcome.FAIL,
        GateReason.NODE_NOT_READY,
        says="still after 0:01:00",
    ),
    Case(
        "incomplete-pool-waits",
        claim(),
        slices(count=2),
        SOON,
        GateOutcome.WAIT,
        GateReason.NODE_NOT_READY,
        says="PoolIncomplete",
    ),
    Case(
        "stale-waits",
        claim(),
        slices(nv.layout_devices(nv.BALANCED, seed="old")),
        SOON,
        GateOutcome.WAIT,
        GateReason.NODE_NOT_READY,
        expected=dataclasses.replace(EXPECTED, host_mig_uuids=frozenset({"MIG-new"})),
        says="StaleGeneration",
    ),
    Case(
        "layout-mismatch-fails-now",
        claim(),
        slices(nv.layout_devices(nv.ALL_1G)),
        SOON,
        GateOutcome.FAIL,
        GateReason.NODE_NOT_READY,
        says="LayoutMismatch",
    ),
    Case(
        "host-mismatch-fails-now",
        claim(),
        slices(),
        SOON,
        GateOutcome.FAIL,
        GateReason.NODE_NOT_READY,
        expected=dataclasses.replace(EXPECTED, host_agrees=False),
        says="HostMismatch",
    ),
    Case(
        "own-device-tainted-fails-now",
        claim(),
        TAINTED_POOL,
        SOON,
        GateOutcome.FAIL,
        GateReason.DEVICE_TAINTED,
        says="gpu.nvidia.com/xid=79:NoSchedule",
    ),
    # One bad device is that device's problem: a claim on a healthy sibling binds (issue 15).
    Case(
        "sibling-tainted-still-binds",
        claim(gpu={"device": nv.mig_name("2g.48gb", 0)}),
        TAINTED_POOL,
        SOON,
        GateOutcome.BIND,
        GateReason.GPU_READY,
    ),
    Case(
        "gpu-lost-fails-siblings-too",
        claim(gpu={"device": nv.mig_name("2g.48gb", 0)}),
        slices([nv.mig_device("1g.24gb", 6, taints=[nv.gpu_lost_taint()]), *nv.layout_devices(nv.BALANCED[1:])]),
        SOON,
        GateOutcome.FAIL,
        GateReason.NODE_NOT_READY,
        says="DeviceTainted",
    ),
    Case(
        "device-gone-from-ready-pool",
        claim(gpu={"device": nv.mig_name("1g.24gb", 3)}),
        slices(),
        SOON,
        GateOutcome.FAIL,
        GateReason.DEVICE_MISSING,
        says="gpu-0-mig-1g24gb-14-3 not in generation 1",
    ),
    Case(
        "not-colocated",
        claim(gpu={"pool": "gex131-b"}),
        slices(),
        SOON,
        GateOutcome.FAIL,
        GateReason.NOT_COLOCATED,
        says="pools gex131-b",
    ),
    Case(
        "no-timestamp-uses-creation",
        claim(allocated=None),
        [],
        ALLOCATED + datetime.timedelta(seconds=30),
        GateOutcome.FAIL,
        GateReason.NODE_NOT_READY,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_claim_gate_decision(case: Case) -> None:
    verdicts, current = world(case.slices, case.expected)
    decision = decisions.claim_gate_decision(case.claim, verdicts, current, case.now)
    assert decision.outcome is case.outcome, decision.message
    assert decision.reason is case.reason
    assert case.says in decision.message
    writes = case.outcome in (GateOutcome.BIND, GateOutcome.FAIL)
    assert bool(decision.entries) is writes
    assert (decision.recheck_at is not None) is (case.outcome is GateOutcome.WAIT)


def test_node_not_evaluated_yet_waits_until_grace() -> None:
    decision = decisions.claim_gate_decision(claim(), {}, {}, SOON)
    assert (decision.outcome, decision.reason) == (GateOutcome.WAIT, GateReason.NODE_UNKNOWN)
    assert decision.recheck_at == ALLOCATED + decisions.DEFAULT_GATE_GRACE
    late = decisions.claim_gate_decision(claim(), {}, {}, LATE)
    assert (late.outcome, late.reason) == (GateOutcome.FAIL, GateReason.NODE_UNKNOWN)


def test_grace_is_configurable() -> None:
    verdicts, current = world([])
    decision = decisions.claim_gate_decision(claim(), verdicts, current, LATE, grace=datetime.timedelta(minutes=5))
    assert decision.outcome is GateOutcome.WAIT
    assert decision.recheck_at == ALLOCATED + datetime.timedelta(minutes=5)


def test_tolerated_device_taint_does_not_fail_the_claim() -> None:
    tolerant = claim(gpu={"tolerations": [{"key": "gpu.nvidia.com/xid", "operator": "Exists"}]})
    ready = {NODE: decisions.pool_verdict(slices(), NODE, EXPECTED)}  # verdict from before the XID
    decision = decisions.claim_gate_decision(tolerant, ready, decisions.current_pools(TAINTED_POOL, NODE), SOON)
    assert decision.outcome is GateOutcome.BIND
    intolerant = claim(gpu={"tolerations": [{"key": "gpu.nvidia.com/xid", "value": "13", "effect": "NoSchedule"}]})
    decision = decisions.claim_gate_decision(intolerant, ready, decisions.current_pools(TAINTED_POOL, NODE), SOON)
    assert decision.reason is GateReason.DEVICE_TAINTED


def test_bind_entry_shape() -> None:
    verdicts, current = world(slices())
    foreign = {
        "type": "example.com/observed",
        "status": "True",
        "reason": "R",
        "message": "",
        "lastTransitionTime": "t0",
    }
    existing = gate_entry(domain.GATE_FAILURE_CONDITION, "False") | {
        "conditions": [
            foreign,
            {
                "type": domain.GATE_FAILURE_CONDITION,
                "status": "False",
                "reason": "X",
                "message": "",
                "lastTransitionTime": "t0",
            },
        ]
    }
    (entry,) = decisions.claim_gate_decision(claim(devices=[existing]), verdicts, current, SOON).entries
    assert decisions.device_status_key(entry) == (domain.GATE_DRIVER, NODE, "gate", SHARE)
    by_type = {c["type"]: c for c in entry["conditions"]}
    assert by_type["example.com/observed"] == foreign
    assert by_type[domain.GATE_BINDING_CONDITION] == {
        "type": domain.GATE_BINDING_CONDITION,
        "status": "True",
        "reason": "GPUReady",
        "message": f"node {NODE} GPU ready and the claim's devices are in its current pool",
        "lastTransitionTime": "2026-09-01T12:00:20Z",
        "observedGeneration": 1,
    }
    failure = by_type[domain.GATE_FAILURE_CONDITION]
    assert (failure["status"], failure["lastTransitionTime"]) == ("False", "t0")


def test_fail_entry_sets_failure_true() -> None:
    verdicts, current = world(TAINTED_POOL)
    (entry,) = decisions.claim_gate_decision(claim(), verdicts, current, SOON).entries
    statuses = {c["type"]: (c["status"], c["reason"]) for c in entry["conditions"]}
    assert statuses == {
        domain.GATE_BINDING_CONDITION: ("False", "DeviceTainted"),
        domain.GATE_FAILURE_CONDITION: ("True", "DeviceTainted"),
    }


def test_merged_device_statuses_upserts_by_map_key() -> None:
    nvidia = {"driver": "gpu.nvidia.com", "pool": NODE, "device": GPU_DEVICE, "data": {"x": 1}}
    old = gate_entry(domain.GATE_BINDING_CONDITION, "False")
    base = claim(devices=[nvidia, old])
    verdicts, current = world(slices())
    entries = decisions.claim_gate_decision(base, verdicts, current, SOON).entries
    merged = decisions.merged_device_statuses(base, entries)
    assert merged[0] == nvidia
    assert len(merged) == 2
    assert merged[1]["conditions"][0]["status"] == "True"


def test_gate_only_claim_binds_on_ready_node() -> None:
    gate_only = claim()
    gate_only["status"]["allocation"]["devices"]["results"] = [gate_result()]
    verdicts, current = world(slices())
    assert decisions.claim_gate_decision(gate_only, verdicts, current, SOON).outcome is GateOutcome.BIND
    verdicts, current = world(slices(count=2))
    assert decisions.claim_gate_decision(gate_only, verdicts, current, SOON).outcome is GateOutcome.WAIT


def test_verdict_reasons_are_classified() -> None:
    """Every PoolReason is either transient or fatal for a waiting claim (exhaustive over the enum)."""
    transient = {
        PoolReason.PLUGIN_NOT_RUNNING,
        PoolReason.NO_SLICES,
        PoolReason.POOL_INCOMPLETE,
        PoolReason.STALE_GENERATION,
    }
    for reason in PoolReason:
        if reason is PoolReason.READY:
            continue
        verdict = decisions.PoolVerdict(NODE, reason, "m")
        decision = decisions.claim_gate_decision(claim(), {NODE: verdict}, {}, SOON)
        assert decision.outcome is (GateOutcome.WAIT if reason in transient else GateOutcome.FAIL), reason
