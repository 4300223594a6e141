"""The operator's own Prometheus metrics (the Robot budget's live in ``hetzner.budget_metrics``).

Per-step durations like Metal3's operation history, gate latency, hosts by state, claims the gate holds,
and the standby pool, so the figures the README quotes can also be watched in production
(``config/grafana/capi-gpu-dashboard.json`` draws them; a test checks it queries only these names).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)

STEP_SECONDS = Histogram(
    "capi_gpu_host_step_duration_seconds", "Time a host spent in a state or step", ["step"], buckets=_BUCKETS
)
GATE_SECONDS = Histogram(
    "capi_gpu_gate_latency_seconds",
    "From the driver's ResourceSlice to the node gate's decision",
    ["transition"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
STANDBY_HOSTS = Gauge("capi_gpu_standby_hosts", "Hosts prepared and waiting on standby", ["template"])
CLAIM_DECISIONS = Counter("capi_gpu_claim_gate_decisions_total", "Binding-condition writes", ["outcome"])
HOSTS = Gauge("capi_gpu_hosts", "HetznerGPUHosts this operator reconciles, by state", ["state"])
CLAIMS_WAITING = Gauge(
    "capi_gpu_claims_waiting_on_gate",
    "Allocated claims the gate holds in PreBind (no binding condition written yet), per workload cluster",
    ["cluster"],
)

# Last state seen per host; the gauge is recounted from it, so a host that changes state or goes away
# moves between series instead of being counted twice.
_host_states: dict[tuple[str, str], str] = {}


def observe_step(step: str, seconds: float) -> None:
    STEP_SECONDS.labels(step=step).observe(max(0.0, seconds))


def host_state(namespace: str, name: str, state: str | None) -> None:
    """Record a host's state after a reconcile (None: it is gone or no longer ours)."""
    key = (namespace, name)
    before = _host_states.get(key)
    if state is None:
        _host_states.pop(key, None)
    else:
        _host_states[key] = state
    for changed in {before, state} - {None}:
        HOSTS.labels(state=changed).set(sum(1 for s in _host_states.values() if s == changed))
