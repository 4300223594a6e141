"""pytest fixtures over the local control plane (registered from the repo's root conftest.py).

Session-scoped: one control plane per test run (about 10 s to start), a fresh namespace per test.
Nothing skips: missing binaries are built by ``binaries.ensure_built()``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from capi_gpu.kube import NAMESPACES, Kube
from capi_gpu_sim.controlplane import ControlPlane, Options


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(Path(tmp_path_factory.mktemp("controlplane")), Options(binding_timeout_seconds=20))
    cp.start()
    try:
        yield cp
    finally:
        cp.stop(grace_s=1.0)  # memory-backed: nothing to drain for


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    k = control_plane.kube()
    yield k
    k.close()


@pytest.fixture(scope="session")
def workload_kube(kube: Kube) -> Kube:
    """The workload cluster's client: the same apiserver (a self-hosted cluster, see controlplane.py)."""
    return kube


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    kube.delete(NAMESPACES, name)
