"""Fixtures of the manifest tests: what `kustomize build config/default` renders, built once."""

from __future__ import annotations

from typing import Any

import config_helpers as h
import pytest


@pytest.fixture(scope="session")
def components() -> list[dict[str, Any]]:
    return h.kustomize_build(h.CONFIG / "default")
