"""Shared test hygiene: no test may leak an asyncio task (as in kopf's own suite)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    before = set(asyncio.all_tasks())
    yield
    leaked = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
    for t in leaked:
        t.cancel()
    assert not leaked, f"test leaked asyncio tasks: {leaked}"
