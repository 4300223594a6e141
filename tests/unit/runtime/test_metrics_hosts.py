"""capi_gpu_hosts{state}: a host moves between state series as it changes state, is counted once, and leaves
every series when its loop ends (deleted, or no longer this replica's)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from capi_gpu.runtime import metrics


def hosts(state: str) -> float:
    return REGISTRY.get_sample_value("capi_gpu_hosts", {"state": state}) or 0.0


def test_hosts_move_between_state_series() -> None:
    before = {s: hosts(s) for s in ("Available", "Provisioning", "Provisioned")}
    metrics.host_state("ns-m", "a", "Available")
    metrics.host_state("ns-m", "b", "Available")
    metrics.host_state("ns-m", "a", "Available")  # the same state again counts once
    assert hosts("Available") == before["Available"] + 2
    metrics.host_state("ns-m", "a", "Provisioning")
    assert (hosts("Available"), hosts("Provisioning")) == (before["Available"] + 1, before["Provisioning"] + 1)
    metrics.host_state("ns-m", "a", "Provisioned")
    assert hosts("Provisioning") == before["Provisioning"] and hosts("Provisioned") == before["Provisioned"] + 1
    metrics.host_state("ns-m", "a", None)
    metrics.host_state("ns-m", "b", None)
    metrics.host_state("ns-m", "never-seen", None)  # a loop that ends before its first pass
    assert {s: hosts(s) for s in before} == before
