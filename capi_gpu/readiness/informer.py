"""A small informer: list, then watch from that resourceVersion, forever, in a thread.

The readiness gate must react to Nodes, ResourceSlices and ResourceClaims without a polling loop; the
official client's watch is blocking, so each kind gets one thread that feeds an asyncio queue. A
closed watch resumes from the last resourceVersion; a 410 Gone (compacted) relists and reports every
object again, and every object that vanished in the gap as DELETED, so consumers never miss a change,
they may only see one twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from capi_gpu.kube import Kube, Obj, Res

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Change:
    kind: str
    type: str  # ADDED, MODIFIED, DELETED, SYNC (from a relist)
    obj: Obj
    seen: float  # time.monotonic() when it arrived (gate latency)


class Informer:
    def __init__(
        self,
        kube: Kube,
        res: Res,
        kind: str,
        emit: Callable[[Change], None],
        label_selector: str | None = None,
        field_selector: str | None = None,
        namespace: str | None = None,
    ) -> None:
        self.kube, self.res, self.kind, self.emit = kube, res, kind, emit
        self.namespace = namespace or None  # None (or ""): every namespace
        self.label_selector, self.field_selector = label_selector, field_selector
        self._stop = threading.Event()
        self._known: dict[tuple[str, str], Obj] = {}  # the last state of every object reported, for relists
        self._thread = threading.Thread(target=self._run, name=f"informer-{kind}", daemon=True)

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _list(self) -> str:
        page = self.kube._call(
            "GET",
            self.res.path(self.namespace),
            query={"labelSelector": self.label_selector, "fieldSelector": self.field_selector},
        )
        listed: dict[tuple[str, str], Obj] = {}
        for obj in page.get("items", []):
            listed[_key(obj)] = obj
            self.emit(Change(self.kind, "SYNC", obj, time.monotonic()))
        # What was deleted while no watch was open shows up only as absence from the list: report it, with
        # the last state seen, so the consumer knows which node a vanished ResourceSlice belonged to.
        for key in self._known.keys() - listed.keys():
            self.emit(Change(self.kind, "DELETED", self._known[key], time.monotonic()))
        self._known = listed
        rv: str = page.get("metadata", {}).get("resourceVersion", "")
        self.emit(Change(self.kind, "SYNCED", {}, time.monotonic()))
        return rv

    def _run(self) -> None:
        rv = ""
        backoff = 0.5
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._list()
                for etype, obj in self.kube.watch(
                    self.res,
                    namespace=self.namespace,
                    resource_version=rv,
                    label_selector=self.label_selector,
                    field_selector=self.field_selector,
                    timeout_seconds=120,
                    stop=self._stop,
                ):
                    if etype == "ERROR":
                        rv = ""  # 410 Gone: relist
                        break
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if etype == "BOOKMARK":
                        continue
                    if etype == "DELETED":
                        self._known.pop(_key(obj), None)
                    else:
                        self._known[_key(obj)] = obj
                    self.emit(Change(self.kind, etype, obj, time.monotonic()))
                backoff = 0.5
            except Exception as exc:  # a dead informer thread would blind the gate for good
                # Besides KubeError and OSError, a watch stream cut mid-chunk (apiserver restart, idle
                # timeout of a load balancer) surfaces as urllib3's ProtocolError; every one of them is
                # retried, resuming from the last resourceVersion.
                if not self._stop.is_set():
                    log.info("informer %s: %s: %s; retrying", self.kind, type(exc).__name__, exc)
                if getattr(exc, "status", 0) == 410:
                    rv = ""
                self._stop.wait(backoff)
                backoff = min(10.0, backoff * 2)


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


class Feed:
    """The informers of one daemon (the gate, the claim scaler), all feeding one asyncio queue that the
    daemon's loop reads. Made inside that loop: the informer threads hand changes over to it."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.queue: asyncio.Queue[Change] = asyncio.Queue()
        self.informers: list[Informer] = []
        self._loop = asyncio.get_running_loop()

    def watch(
        self,
        res: Res,
        kind: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        namespace: str | None = None,
    ) -> None:
        """Start one more informer; its changes arrive as ``kind``."""
        informer = Informer(self.kube, res, kind, self._emit, label_selector, field_selector, namespace)
        self.informers.append(informer.start())

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()

    def _emit(self, change: Change) -> None:
        # A change that arrives while the daemon shuts down has nobody left to read it.
        with contextlib.suppress(RuntimeError):  # the loop is closed
            self._loop.call_soon_threadsafe(self.queue.put_nowait, change)
