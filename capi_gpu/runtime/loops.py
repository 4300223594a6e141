"""The shape every per-object daemon shares: reconcile, then sleep until woken or the requeue time.

A reconcile returns the seconds until the next pass (None: the object is gone). API errors back off
exponentially; a wake-up (another controller changed something this object waits on) cuts the sleep,
and one that comes during a pass is kept, so a loop that waits on a wake-up can requeue late.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from capi_gpu.kube import KubeError, NotFound
from capi_gpu.runtime import metrics
from capi_gpu.runtime.deps import Deps

log = logging.getLogger(__name__)

Reconcile = Callable[[Deps, str, str], Awaitable[float | None]]


async def run(kind: str, reconcile: Reconcile, deps: Deps, namespace: str, name: str, stopped: Any) -> None:
    wake = deps.wakeups.event(kind, namespace, name)
    failures = 0
    try:
        while not stopped:
            # Cleared before the pass, not after: a wake-up that arrives while the pass runs (bootstrap
            # data written just after this pass read the Machine) then starts the next pass at once
            # instead of being lost until the requeue.
            wake.clear()
            try:
                delay = await reconcile(deps, namespace, name)
                failures = 0
            except NotFound:
                return
            except (KubeError, OSError) as exc:
                failures += 1
                delay = min(300.0, 2.0**failures)
                log.warning("%s %s/%s: reconcile failed (%s); retry in %.0fs", kind, namespace, name, exc, delay)
            if delay is None:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=max(0.2, delay))
    finally:
        if kind == "host":
            metrics.host_state(namespace, name, None)  # deleted, or no longer this replica's
        deps.wakeups.forget(kind, namespace, name)
        deps.provisioning.discard((namespace, name))
        deps.os_keys.pop((namespace, name), None)
