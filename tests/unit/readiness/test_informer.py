"""The informer's list/watch contract: initial list then SYNCED, watch events in order, a relist after a
410 reports objects deleted during the gap as DELETED with their last state, and a watch stream cut
mid-chunk is retried instead of ending the thread; a daemon's Feed hands every informer's changes to its
loop's queue."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from urllib3.exceptions import ProtocolError

from capi_gpu.kube import RESOURCESLICES, Res
from capi_gpu.readiness.informer import Change, Feed, Informer


class MemoryApi:
    """One resource served from memory the way the apiserver serves it: list with a resourceVersion, watch
    from a resourceVersion, and ERROR 410 for a watch that starts below the compacted revision."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = 0
        self.compacted = 0
        self.events: queue.Queue[tuple[str, dict[str, Any]] | Exception] = queue.Queue()
        self.lists = 0

    def put(self, name: str, node: str, *, quiet: bool = False) -> None:
        self.rv += 1
        obj = {"metadata": {"name": name, "resourceVersion": str(self.rv)}, "spec": {"nodeName": node}}
        etype = "MODIFIED" if name in self.objects else "ADDED"
        self.objects[name] = obj
        if not quiet:
            self.events.put((etype, obj))

    def remove(self, name: str, *, quiet: bool = False) -> None:
        self.rv += 1
        obj = self.objects.pop(name)
        if not quiet:
            self.events.put(("DELETED", obj))

    def compact(self) -> None:
        """History is gone: the open watch ends with 410 and a resume from the old revision would too."""
        self.compacted = self.rv
        self.events.put(("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"}))

    def _call(self, method: str, path: str, query: Any = None, **_: Any) -> dict[str, Any]:
        assert (method, path) == ("GET", RESOURCESLICES.path())
        self.lists += 1
        return {"items": list(self.objects.values()), "metadata": {"resourceVersion": str(self.rv)}}

    def watch(
        self, res: Res, resource_version: str | None = None, stop: threading.Event | None = None, **_: Any
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        if int(resource_version or 0) < self.compacted:
            yield "ERROR", {"kind": "Status", "code": 410}
            return
        while stop is not None and not stop.is_set():
            try:
                item = self.events.get(timeout=0.02)
            except queue.Empty:
                continue
            if isinstance(item, Exception):
                raise item
            yield item


class Recorder:
    def __init__(self) -> None:
        self.changes: list[Change] = []
        self._lock = threading.Lock()

    def __call__(self, change: Change) -> None:
        with self._lock:
            self.changes.append(change)

    def seen(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(c.type, c.obj.get("metadata", {}).get("name", "")) for c in self.changes]

    def wait_for(self, entry: tuple[str, str], count: int = 1, within: float = 5.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.seen().count(entry) >= count:
                return
            time.sleep(0.01)
        raise AssertionError(f"{entry} not seen {count}x: {self.seen()}")


def run_informer(api: MemoryApi) -> tuple[Informer, Recorder]:
    recorder = Recorder()
    informer = Informer(api, RESOURCESLICES, "slice", recorder).start()  # type: ignore[arg-type]
    return informer, recorder


def test_lists_then_watches_in_order() -> None:
    api = MemoryApi()
    api.put("a", "n1", quiet=True)
    informer, rec = run_informer(api)
    try:
        rec.wait_for(("SYNCED", ""))
        api.put("b", "n2")
        api.put("a", "n1")
        api.remove("b")
        rec.wait_for(("DELETED", "b"))
        assert rec.seen() == [("SYNC", "a"), ("SYNCED", ""), ("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    finally:
        informer.stop()


def test_relist_reports_what_was_deleted_during_the_gap() -> None:
    api = MemoryApi()
    api.put("a", "n1", quiet=True)
    api.put("b", "n2", quiet=True)
    informer, rec = run_informer(api)
    try:
        rec.wait_for(("SYNCED", ""))
        api.remove("b", quiet=True)  # deleted while the history it was in got compacted
        api.put("c", "n3", quiet=True)
        api.compact()
        rec.wait_for(("SYNCED", ""), count=2)
        after = rec.seen()[3:]
        assert sorted(after[:-1]) == [("DELETED", "b"), ("SYNC", "a"), ("SYNC", "c")]
        deleted = next(c for c in rec.changes if c.type == "DELETED")
        assert deleted.obj["spec"]["nodeName"] == "n2", "the last state, so the consumer knows the node"
        assert api.lists == 2
    finally:
        informer.stop()


def test_a_cut_stream_is_resumed_not_fatal() -> None:
    api = MemoryApi()
    informer, rec = run_informer(api)
    try:
        rec.wait_for(("SYNCED", ""))
        api.events.put(ProtocolError("Response ended prematurely"))
        api.put("a", "n1")
        rec.wait_for(("ADDED", "a"))
        assert informer._thread.is_alive()
        assert api.lists == 1, "resumed from the resourceVersion, no relist"
    finally:
        informer.stop()


def test_a_feed_hands_each_informers_changes_to_the_loop_and_stops_them_all() -> None:
    async def scenario() -> tuple[set[tuple[str, str, str]], list[Informer]]:
        api = MemoryApi()
        api.put("a", "n1", quiet=True)
        feed = Feed(api)  # type: ignore[arg-type]
        feed.watch(RESOURCESLICES, "one")
        feed.watch(RESOURCESLICES, "two")
        got: set[tuple[str, str, str]] = set()
        try:
            while not {("one", "SYNCED", ""), ("two", "SYNCED", "")} <= got:
                ch = await asyncio.wait_for(feed.queue.get(), timeout=5.0)
                got.add((ch.kind, ch.type, ch.obj.get("metadata", {}).get("name", "")))
        finally:
            feed.stop()
        return got, feed.informers

    got, informers = asyncio.run(scenario())
    assert {("one", "SYNC", "a"), ("two", "SYNC", "a")} <= got
    for informer in informers:
        informer._thread.join(timeout=2.0)
        assert not informer._thread.is_alive()
