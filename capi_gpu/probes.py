"""`capi-gpu run`'s liveness and readiness endpoints, served for the whole life of the process.

kopf serves its liveness endpoint only once it runs, and with ``--leader-elect`` a standby candidate waits
for the Lease before kopf starts: with no /healthz, the Deployment's livenessProbe killed every standby
after about a minute (a restart loop with two replicas). So the process serves both itself, from before
the election: /healthz (the ``--liveness`` URL's path) answers 200 whenever the event loop answers, as
kopf's did (we register no kopf probes, so that was all it checked); /readyz answers 200 once the
webhook serves (every replica serves it, leader or not: controllers/webhook.serve), or at once without a
webhook. Leadership is not readiness: a standby that is never Ready keeps a two-replica Deployment from
ever being Available (`clusterctl init --wait-providers`, `kubectl rollout status` and alerts all wait
on that), and the webhook Service should reach both replicas, so a failover never leaves it without one.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from dataclasses import dataclass, field

from aiohttp import web

READYZ = "/readyz"


@dataclass
class Probes:
    url: str
    """Where /healthz is served, e.g. ``http://0.0.0.0:8080/healthz``; /readyz is beside it."""
    leading: bool = False
    up: asyncio.Event = field(default_factory=asyncio.Event)
    """kopf's ``ready_flag``: set once the operator has started (reported, not required)."""
    webhook: bool = False
    serving: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the webhook listens (``webhook``: this process serves one)."""

    def ready(self) -> bool:
        return self.serving.is_set() if self.webhook else True

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"alive": True, "leading": self.leading})

    async def _readyz(self, _: web.Request) -> web.Response:
        ready = self.ready()
        body = {"ready": ready, "leading": self.leading, "operating": self.up.is_set()}
        return web.json_response(body, status=200 if ready else 503)

    async def start(self) -> web.AppRunner:
        parts = urllib.parse.urlsplit(self.url)
        app = web.Application()
        app.add_routes([web.get(parts.path or "/healthz", self._healthz), web.get(READYZ, self._readyz)])
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, parts.hostname or None, parts.port or 80).start()
        return runner
