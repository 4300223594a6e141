"""The operator's own Prometheus metrics (the Robot budget's live in ``hetzner.metrics``).

Per-step durations like Metal3's operation history, gate latency, and the standby pool, so the figures
the README quotes can also be watched in production.
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


def observe_step(step: str, seconds: float) -> None:
    STEP_SECONDS.labels(step=step).observe(max(0.0, seconds))
