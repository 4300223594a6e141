"""kopf's diffbase lives in memory: storing it patches nothing on the object (a paused object must not be
written by kopf's bookkeeping), a stored essence is fetched back per uid, and the memory is bounded."""

from __future__ import annotations

import kopf

from capi_gpu.controllers import handlers
from capi_gpu.runtime.diffbase import MemoryDiffBaseStorage


def _body(uid: str, spec: dict[str, object]) -> kopf.Body:
    return kopf.Body({"metadata": {"uid": uid, "name": uid, "annotations": {"a": "1"}}, "spec": spec})


def test_store_writes_nothing_and_fetch_returns_the_essence_per_uid() -> None:
    storage = MemoryDiffBaseStorage()
    body = _body("u1", {"x": 1})
    assert storage.fetch(body=body) is None  # new to kopf: no handler runs for that
    essence = storage.build(body=body)
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=essence)
    assert dict(patch) == {}  # the annotation storage would have patched metadata.annotations here
    assert storage.fetch(body=_body("u1", {"x": 2})) == essence
    assert storage.fetch(body=_body("u2", {"x": 1})) is None


def test_memory_is_bounded_oldest_first() -> None:
    storage = MemoryDiffBaseStorage(limit=2)
    for uid in ("a", "b", "c"):
        body = _body(uid, {})
        storage.store(body=body, patch=kopf.Patch(), essence=storage.build(body=body))
    assert [storage.fetch(body=_body(u, {})) is not None for u in ("a", "b", "c")] == [False, True, True]


def test_the_operator_uses_it() -> None:
    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    assert isinstance(settings.persistence.diffbase_storage, MemoryDiffBaseStorage)
