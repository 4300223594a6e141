"""Choosing a host for a machine: pure, so the rules (selector, GPU model, standby match, skips with
counted reasons) are tested without an apiserver.

Preference order: a standby host prepared exactly for this machine (a scale-up costs one bootstrap),
then an Available host already inspected, then any other Available one; ties broken by server number
so two controllers racing for hosts tend to pick the same one and one loses the conflict cleanly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from capi_gpu.api.base import LabelSelector
from capi_gpu.api.host import HetznerGPUHost, HostState


@dataclass(frozen=True)
class Pick:
    host: HetznerGPUHost | None
    skipped: dict[str, int]

    def describe(self) -> str:
        if not self.skipped:
            return "no HetznerGPUHost in this namespace"
        return ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))


def _skip(host: HetznerGPUHost, selector: LabelSelector, gpu_model: str | None) -> str | None:
    raw: Any = host.metadata.get("labels") or {}
    labels = {str(k): str(v) for k, v in raw.items()}
    if not selector.matches(labels):
        return "selector mismatch"
    if host.metadata.get("deletionTimestamp"):
        return "deleting"
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
    return None


def choose(hosts: Sequence[HetznerGPUHost], selector: LabelSelector, gpu_model: str | None, prepared: str) -> Pick:
    skipped: Counter[str] = Counter()
    ok: list[HetznerGPUHost] = []
    for host in hosts:
        why = _skip(host, selector, gpu_model)
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
