"""Wake-ups between loops: one object's loop, or every loop of a kind in a namespace (a fixed Robot Secret
wakes all hosts; a tripped 401 circuit wakes the HetznerGPUClusters), never another namespace's."""

from __future__ import annotations

from capi_gpu.runtime.deps import Wakeups


async def test_wake_all_sets_every_loop_of_the_kind_in_the_namespace_only() -> None:
    w = Wakeups()
    a, b = w.event("host", "gpu", "a"), w.event("host", "gpu", "b")
    other_ns, other_kind = w.event("host", "other", "a"), w.event("cluster", "gpu", "dev")
    w.wake_all("host", "gpu")
    assert a.is_set() and b.is_set()
    assert not other_ns.is_set() and not other_kind.is_set()
    w.wake("cluster", "gpu", "dev")
    assert other_kind.is_set()
