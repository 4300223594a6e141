"""Fixtures for tests on the simulated fleet: a Robot simulator, a fleet behind it, rescue boots.

A test gets a running host with ``fleet`` (one GEX131 behind ``robot``; the host starts in its previous
OS; the local apt repository is bound into its disk boots) and a booted rescue system with ``rescue``
(key registered in Robot, rescue activated, hw reset, sshd up, the pin built from Robot's ``host_key``
answer). Time is compressed (Robot's clock, 600x), so
a 330 s reset is about half a second. Everything here needs root; every fleet is torn down even when
the test fails (``Fleet.close`` via the fixture, then the registry sweep).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from sim_helpers import BOOT_TIMEOUT_S, Rescue, RobotApi, boot_rescue

from capi_gpu_sim import aptrepo
from capi_gpu_sim.fleet import Fleet, FleetConfig
from capi_gpu_sim.hosts import keys, registry
from capi_gpu_sim.hosts.host import HostConfig
from capi_gpu_sim.robot import RobotSim

COMPRESSION = 600.0
KUBERNETES_VERSION = "v1.36.3"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "e2e/sim" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session", autouse=True)
def _root_and_clean() -> Iterator[None]:
    assert os.geteuid() == 0, "the simulated fleet needs root (namespaces, cgroups, mounts)"
    registry.cleanup_stale()
    yield
    registry.cleanup_stale()


@pytest.fixture
def robot() -> Iterator[RobotSim]:
    sim = RobotSim(compression=COMPRESSION).start()
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture(scope="session")
def apt_repo() -> aptrepo.AptRepo:
    return aptrepo.ensure_repo(KUBERNETES_VERSION, "580")


@pytest.fixture
def fleet(robot: RobotSim, apt_repo: aptrepo.AptRepo) -> Iterator[Fleet]:
    with Fleet(FleetConfig(hosts=1, host=HostConfig(), apt_repo=apt_repo), robot=robot) as f:
        assert f.host().wait_up(BOOT_TIMEOUT_S), "the previous OS never came up"
        yield f


@pytest.fixture(scope="session")
def client_key() -> keys.KeyPair:
    return keys.generate(comment="e2e-client")


@pytest.fixture
def robot_api(robot: RobotSim) -> Iterator[RobotApi]:
    api = RobotApi(robot)
    yield api
    api.close()


@pytest.fixture
def rescue(fleet: Fleet, robot_api: RobotApi, client_key: keys.KeyPair) -> Rescue:
    return boot_rescue(fleet.host(), robot_api, client_key)
