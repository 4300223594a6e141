"""The scaler's informer caches: adds, updates and deletes per kind, and a relist (after a 410) drops what
it no longer returns, so a pod deleted during a watch gap is not counted as pending forever."""

from __future__ import annotations

from typing import Any, cast

from capi_gpu.autoscaler.scaler import ClaimScaler
from capi_gpu.readiness.informer import Change


def scaler() -> ClaimScaler:
    return ClaimScaler(cast(Any, None), "team-a", "c1", cast(Any, None))


def pod(name: str, ns: str = "team-a") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}}


def ch(kind: str, type_: str, obj: dict[str, Any] | None = None) -> Change:
    return Change(kind, type_, obj or {}, 0.0)


def test_changes_and_a_relist_that_forgets_the_deleted() -> None:
    s = scaler()
    for c in [
        ch("pod", "SYNC", pod("a")),
        ch("pod", "SYNC", pod("b")),
        ch("pod", "SYNCED"),
        ch("slice", "SYNC", {"metadata": {"name": "gex-1-gpu.nvidia.com-x"}}),
        ch("slice", "SYNCED"),
        ch("pod", "ADDED", pod("c")),
        ch("pod", "DELETED", pod("a")),
    ]:
        s._apply(c)
    assert set(s.pods) == {("team-a", "b"), ("team-a", "c")}
    assert set(s.slices) == {"gex-1-gpu.nvidia.com-x"}
    assert s._synced == {"pod", "slice"}
    # 410 Gone: the informer lists again; "b" was deleted while the watch was down.
    for c in [ch("pod", "SYNC", pod("c")), ch("pod", "SYNC", pod("d")), ch("pod", "SYNCED")]:
        s._apply(c)
    assert set(s.pods) == {("team-a", "c"), ("team-a", "d")}
    assert set(s.slices) == {"gex-1-gpu.nvidia.com-x"}
