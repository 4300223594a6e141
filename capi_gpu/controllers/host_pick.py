"""Choosing a host for a machine: pure, so the rules (selector, GPU model, standby match, skips with
counted reasons) are tested without an apiserver.

A Machine placed in a failure domain (``Machine.spec.failureDomain``, one of the HetznerGPUCluster's
Hetzner datacenters, e.g. ``fsn1-dc14``; a location such as ``fsn1`` covers its datacenters) only gets a
host in that datacenter; with none free it waits and says so.

Preference order: a standby host prepared exactly for this machine (a scale-up costs one bootstrap),
then an Available host already inspected, then any other Available one; ties broken by server number
so two controllers racing for hosts tend to pick the same one and one loses the conflict cleanly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from capi_gpu import domain
from capi_gpu.api.base import LabelSelector
from capi_gpu.api.host import HetznerGPUHost, HostState

OTHER_FAILURE_DOMAIN = "in another failure domain"


@dataclass(frozen=True)
class Pick:
    host: HetznerGPUHost | None
    skipped: dict[str, int]

    @property
    def failure_domain_only(self) -> bool:
        """Hosts were free but none in the Machine's failure domain: that is what it waits for."""
        return self.host is None and OTHER_FAILURE_DOMAIN in self.skipped

    def describe(self) -> str:
        if not self.skipped:
            return "no HetznerGPUHost in this namespace"
        return ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))


def in_failure_domain(datacenter: str | None, failure_domain: str) -> bool:
    """``fsn1-dc14`` is in ``fsn1-dc14`` and in ``fsn1``; case as Robot or the user wrote it."""
    dc, fd = (datacenter or "").lower(), failure_domain.lower()
    return bool(dc) and (dc == fd or dc.startswith(f"{fd}-"))


def _skip(
    host: HetznerGPUHost, selector: LabelSelector, gpu_model: str | None, failure_domain: str | None = None
) -> str | None:
    raw: Any = host.metadata.get("labels") or {}
    labels = {str(k): str(v) for k, v in raw.items()}
    if not selector.matches(labels):
        return "selector mismatch"
    if host.metadata.get("deletionTimestamp"):
        return "deleting"
    annotations: Any = host.metadata.get("annotations") or {}
    if domain.PAUSED_ANNOTATION in annotations:
        return "paused"  # it would not act until unpaused (e.g. during capi-gpu image bake)
    if host.spec.retired:
        return "retired"
    if host.spec.maintenance_mode:
        return "in maintenance"
    if host.spec.consumer_ref is not None:
        return "claimed"
    if host.status.state not in (HostState.AVAILABLE, HostState.STANDBY):
        return f"{host.status.state.value.lower()}"
    if gpu_model is not None:
        models = {g.model for g in (host.status.hardware.gpus if host.status.hardware else [])}
        if gpu_model not in models:
            return "other GPU model"
    if failure_domain and not in_failure_domain(host.status.datacenter, failure_domain):
        return OTHER_FAILURE_DOMAIN
    return None


def choose(
    hosts: Sequence[HetznerGPUHost],
    selector: LabelSelector,
    gpu_model: str | None,
    prepared: str,
    failure_domain: str | None = None,
) -> Pick:
    skipped: Counter[str] = Counter()
    ok: list[HetznerGPUHost] = []
    for host in hosts:
        why = _skip(host, selector, gpu_model, failure_domain)
        if why:
            skipped[why] += 1
        else:
            ok.append(host)

    def rank(h: HetznerGPUHost) -> tuple[int, int]:
        if h.status.state is HostState.STANDBY and h.status.prepared == prepared:
            return (0, h.spec.server_number)
        if h.status.state is HostState.AVAILABLE:
            return (1, h.spec.server_number)
        return (2, h.spec.server_number)  # a standby prepared differently: re-prepared on claim

    ok.sort(key=rank)
    return Pick(ok[0] if ok else None, dict(skipped))
