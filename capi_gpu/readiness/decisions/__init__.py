"""The readiness gate's decisions, pure: ResourceSlices, Nodes and claims in; verdicts and patches out.

The per-Cluster daemon and the controllers do the watching and the writing; everything they decide is
here, free of I/O and of the clock (``now`` is a parameter), so it can be tested from tables and replayed
from recorded objects. Split by the object the decision is about:

* ``pools``: is the node's NVIDIA pool the one the MIG layout promises (``pool_verdict``);
* ``plugin``: do the node's kubelet plugins (NVIDIA's, the gate's) run on it (their pods);
* ``node``: the Node condition + startup taint patch, the Machine condition;
* ``claims``: the gate driver's ResourceSlice and the gate device's binding condition on a claim.

The names the callers use are re-exported here.
"""

from __future__ import annotations

from capi_gpu.readiness.decisions.claims import (
    DEFAULT_GATE_GRACE,
    ClaimGateDecision,
    GateOutcome,
    claim_gate_decision,
    device_status_key,
    gate_device_count,
    gate_results,
    gate_slice,
    gate_slice_name,
    merged_device_statuses,
)
from capi_gpu.readiness.decisions.node import (
    NodePatch,
    NodeSubresource,
    NodeWrite,
    machine_condition,
    node_gate_patch,
)
from capi_gpu.readiness.decisions.plugin import PluginCheck, plugin_problem
from capi_gpu.readiness.decisions.pools import (
    CurrentPool,
    DeviceTaint,
    ExpectedPool,
    LayoutDevice,
    PoolDevice,
    PoolVerdict,
    Problem,
    current_pools,
    pool_verdict,
)

__all__ = [
    "DEFAULT_GATE_GRACE",
    "ClaimGateDecision",
    "CurrentPool",
    "DeviceTaint",
    "ExpectedPool",
    "GateOutcome",
    "LayoutDevice",
    "NodePatch",
    "NodeSubresource",
    "NodeWrite",
    "PluginCheck",
    "PoolDevice",
    "PoolVerdict",
    "Problem",
    "claim_gate_decision",
    "current_pools",
    "device_status_key",
    "gate_device_count",
    "gate_results",
    "gate_slice",
    "gate_slice_name",
    "machine_condition",
    "merged_device_statuses",
    "node_gate_patch",
    "plugin_problem",
    "pool_verdict",
]
