"""Shared fixtures for the gpu tests: the built-in catalog's models."""

from __future__ import annotations

import pytest

from capi_gpu.gpu import catalog


@pytest.fixture
def rtx() -> catalog.GpuModel:
    return catalog.builtin_catalog()["rtx-pro-6000"]


@pytest.fixture
def h100() -> catalog.GpuModel:
    return catalog.builtin_catalog()["h100-80gb"]
