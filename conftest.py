"""Repo-wide pytest plugins: the control-plane fixtures serve tests/integration and e2e/ alike.

Also the order test files run in: heaviest first (``hack/test-durations.json``, seconds per file from the
last measured run; ``make test-durations`` rewrites it from a JUnit report). ``make test`` runs two workers
with ``--dist loadfile --no-loadscope-reorder``, and xdist hands each worker the next file in this order as
it runs out, so the e2e files that take minutes start first and the hundreds of sub-second unit files fill
in at the end. xdist's own order (most tests first) did the opposite: the table-driven unit files went
first and the few-test e2e files, minutes each, last, where one of them could run alone for minutes while
the other worker sat idle. A file the table does not know is weighed by its tier (``UNKNOWN_S``), so a new
e2e file still starts early.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["capi_gpu_sim.fixtures"]

DURATIONS = Path(__file__).parent / "hack" / "test-durations.json"
UNKNOWN_S = {"e2e": 120.0, "tests/integration": 10.0}


def _weight(path: str, known: dict[str, float]) -> float:
    if path in known:
        return known[path]
    return next((s for prefix, s in UNKNOWN_S.items() if path.startswith(prefix + "/")), 1.0)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    known: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    root = config.rootpath
    # A stable sort: a file's tests keep their order, and files of equal weight their collection order.
    items.sort(key=lambda item: -_weight(item.path.relative_to(root).as_posix(), known))
