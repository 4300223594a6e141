"""Whole-flow fixtures: a simulated world (real control plane + Robot sim + GEX131 fleet + operator).

``world`` is module-scoped (a world costs ~10 s to start and its hosts are inspected once); tests in a
module share it and leave it as they found it (scale back to 0). ``fresh_world`` gives a test its own.
A failing test's world leaves ``dump.json`` (Events, statuses) and the operator logs in its state dir.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from capi_gpu_sim.hosts import registry
from capi_gpu_sim.world import World, WorldConfig


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "e2e/flow" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session", autouse=True)
def _root() -> Iterator[None]:
    assert os.geteuid() == 0, "the simulated fleet needs root (namespaces, cgroups, mounts)"
    registry.cleanup_stale()
    yield
    registry.cleanup_stale()


WorldFactory = Callable[..., World]


@pytest.fixture(scope="module")
def world_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorldFactory]:
    worlds: list[World] = []

    def make(**config: object) -> World:
        state = Path(tmp_path_factory.mktemp("world"))
        w = World(WorldConfig(state_dir=state, **config))  # type: ignore[arg-type]
        worlds.append(w)
        return w.start()

    yield make
    for w in worlds:
        w.stop()


@pytest.fixture(scope="module")
def world(world_factory: WorldFactory) -> World:
    return world_factory(hosts=3)
