"""Which pending pods the claim-aware scaler may take when cluster-autoscaler runs in the same cluster,
read from the Events CA posts on pods. Pure: Event dicts in, verdicts out.

Why Events, and not only "count CA's coming nodes as supply" (which ``decide`` also does): both scalers
see a pod turn Unschedulable at the same moment, and each decides within seconds (CA's scan interval, our
debounce). Counting coming nodes only helps the one that decides second, after the other's replicas
patch; when both decide in the same few seconds, the same claim gets two nodes. That happened with CA
1.36.1 scaling a MIG group from zero from the node it had cached, while the claim scaler raised its own
group for the same claim. CA posts exactly one of two Events on every pod it considers in a scale-up:

* ``TriggeredScaleUp``: CA asked a node group for a node for this pod. It is CA's.
* ``NotTriggerScaleUp``: no group CA manages can take it (``cannot allocate all claims`` for a DRA claim
  its template node can't serve, the group at max, backoff, ...). Nobody is adding a node for it.

With ``PodPolicy.CA_DECLINED`` a pod counts as demand only once CA's newest verdict on it (for this pod's
uid) is ``NotTriggerScaleUp``. CA always decides first, and the claim scaler serves what CA left, so the
two never add nodes for the same claim, whatever the timing. The price is CA's answer: one CA loop
(``--scan-interval``, 10 s by default) before the claim scaler acts, and nothing at all while CA is down
(a pod CA never answers is never taken; see docs/autoscaling.md §3).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from capi_gpu.unstructured import as_map, parse_time

Key = tuple[str, str]  # (namespace, name)
CA_SOURCE = "cluster-autoscaler"  # the Event source component CA's recorder posts with
# The claim scaler's watch on the workload cluster's Events: pods only, CA's only.
FIELD_SELECTOR = f"involvedObject.kind=Pod,source={CA_SOURCE}"


class Verdict(StrEnum):
    TRIGGERED = "TriggeredScaleUp"
    DECLINED = "NotTriggerScaleUp"


@dataclass(frozen=True, slots=True)
class Said:
    verdict: Verdict
    uid: str
    at: datetime.datetime
    message: str


def _when(event: Mapping[str, Any]) -> datetime.datetime | None:
    """When the Event was last said: a repeated Event keeps its object and moves lastTimestamp (core/v1)
    or series.lastObservedTime (events.k8s.io); the first occurrence has only the earlier fields."""
    for raw in (
        as_map(event.get("series")).get("lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("eventTime"),
        event.get("firstTimestamp"),
        as_map(event.get("metadata")).get("creationTimestamp"),
    ):
        if (stamp := parse_time(raw)) is not None:
            return stamp
    return None


def verdicts(events: Iterable[Mapping[str, Any]]) -> dict[Key, Said]:
    """CA's newest verdict per pod; a tie at the same second goes to TriggeredScaleUp (CA's, not ours:
    the side that cannot add a second node)."""
    out: dict[Key, Said] = {}
    for event in events:
        obj = as_map(event.get("involvedObject"))
        source = as_map(event.get("source")).get("component") or event.get("reportingComponent")
        if obj.get("kind") != "Pod" or source != CA_SOURCE:
            continue
        try:
            verdict = Verdict(str(event.get("reason")))
        except ValueError:
            continue
        at = _when(event)
        if at is None:
            continue
        key = (str(obj.get("namespace", "")), str(obj.get("name", "")))
        said = Said(verdict, str(obj.get("uid", "")), at, str(event.get("message", "")))
        old = out.get(key)
        if old is None or (said.at, said.verdict is Verdict.TRIGGERED) > (old.at, old.verdict is Verdict.TRIGGERED):
            out[key] = said
    return out


def left_to_ca(
    pod: Mapping[str, Any],
    said: Mapping[Key, Said],
    now: datetime.datetime | None = None,
    grace: datetime.timedelta = datetime.timedelta(0),
) -> str | None:
    """Why the claim scaler leaves ``pod`` to cluster-autoscaler, or None when CA declined it (at least
    ``grace`` before ``now``: CA declines while its group's node is under a minute old, then scales)."""
    meta = as_map(pod.get("metadata"))
    got = said.get((str(meta.get("namespace", "")), str(meta.get("name", ""))))
    if got is None or (got.uid and got.uid != str(meta.get("uid", ""))):
        return "cluster-autoscaler has not answered for it yet"
    if got.verdict is Verdict.TRIGGERED:
        return f"cluster-autoscaler scales up for it ({got.message or got.verdict.value})"
    if now is not None and grace and now - got.at < grace:
        wait = f"{grace.total_seconds():.0f}s"
        return f"cluster-autoscaler declined it at {got.at:%H:%M:%S}; waiting {wait} in case it scales for it after all"
    return None
