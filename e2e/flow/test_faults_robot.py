"""Robot misbehaving while fresh hosts are inspected (rescue activation, reset, inspection) in one running
world: a 5xx rate with added latency, tight per-endpoint limits answered 403 RATE_LIMIT_EXCEEDED, and a
wrong password in the credentials Secret. Each ends with the hosts converged and the request log checked:
no reset or activation performed twice, a 403's interval waited out, and after a 401 not one more login
(never the three that block the IP), not even from an operator restarted meanwhile, the HetznerGPUCluster
saying why, and a fixed Secret resuming."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fault_kit import (
    CLUSTERS,
    activations,
    calls,
    condition,
    host_name,
    logins_refused,
    ops,
    resets,
    robot_log,
    status,
    until,
)

from capi_gpu.kube import SECRETS
from capi_gpu_sim.world import World

LIMIT_INTERVAL_S = 4  # real seconds: the tight limits' window, which the 403's interval says


@pytest.fixture(scope="module")
def robot_world(world_factory: Callable[..., World]) -> Iterator[World]:
    world = world_factory(hosts=0)
    yield world


def _inspected(world: World, numbers: list[int]) -> bool:
    return all(status(world, n).get("state") == "Available" and status(world, n).get("hardware") for n in numbers)


def _one_reset_and_one_activation_each(world: World, numbers: list[int], since: int) -> None:
    for n in numbers:
        assert len(activations(world, n, since)) == 1, calls(world, n, "POST", "/boot", since)
        assert len(resets(world, n, since)) == 1, calls(world, n, "POST", "/reset", since)
        # The reset Robot performed is one the host's status records (the ladder never resent a rung).
        sent = [o for o in ops(world, n) if o["name"].startswith("reset-") and o.get("outcome") != "Deferred"]
        assert len(sent) >= 1 and len({o["name"] for o in sent}) == len(sent), sent


def test_5xx_and_latency_hosts_still_inspected_once_each(robot_world: World) -> None:
    world = robot_world
    assert world.robot is not None
    since = len(robot_log(world))
    world.robot.set_faults(error_every=4, latency_s=0.25)
    try:
        numbers = [world.add_host(), world.add_host()]
        until("both hosts inspected despite 5xx and latency", lambda: _inspected(world, numbers), 240, world)
    finally:
        world.robot.set_faults(error_every=0, latency_s=0.0)
    log = robot_log(world, since)
    failed = [e for e in log if e.status == 500]
    assert failed, "the fault never bit: no 500 in the log"
    _one_reset_and_one_activation_each(world, numbers, since)
    # A read answered 500 was retried (reads are safe to repeat), and a 500 never turned into a 401 storm.
    assert any(e.method == "GET" for e in failed) or len(failed) < 3
    assert not logins_refused(world, since)


def test_403_rate_limit_waits_the_interval_and_converges(robot_world: World) -> None:
    world = robot_world
    assert world.robot is not None
    since = len(robot_log(world))
    window = LIMIT_INTERVAL_S * world.robot.clock.compression  # sim seconds
    tight = {"POST /boot/{n}/rescue": (1, window), "POST /reset/{n}": (1, window)}
    world.robot.set_faults(rate_limits=tight)
    try:
        numbers = [world.add_host(), world.add_host()]
        until("both hosts inspected under tight limits", lambda: _inspected(world, numbers), 240, world)
    finally:
        world.robot.set_faults(rate_limits={})
    log = robot_log(world, since)
    limited = [e for e in log if e.status == 403 and e.code == "RATE_LIMIT_EXCEEDED"]
    assert limited, "two hosts at once never exceeded a limit of one per window"
    compression = world.robot.clock.compression
    for hit in limited:
        later = [e for e in log if e.endpoint == hit.endpoint and e.t > hit.t]
        assert later, f"nothing was sent to {hit.endpoint} after its 403"
        waited = (later[0].t - hit.t) / compression  # real seconds, as the client counts them
        assert waited >= LIMIT_INTERVAL_S * 0.9, f"{hit.endpoint} called again {waited:.2f}s after its 403"
    assert len(limited) <= 2 * len(tight), [(e.endpoint, e.t) for e in limited]
    _one_reset_and_one_activation_each(world, numbers, since)


def _set_password(world: World, password: str) -> None:
    value = base64.b64encode(password.encode()).decode()
    world.k.patch(SECRETS, "robot-credentials", {"data": {"robot-password": value}}, world.config.namespace)


def _credentials_condition(world: World) -> dict[str, Any] | None:
    hgc = world.k.get(CLUSTERS, world.config.cluster, world.config.namespace)
    return condition(hgc, "RobotCredentialsValid")


def test_401_stops_every_call_after_one_failed_login_and_a_fixed_secret_resumes(robot_world: World) -> None:
    world = robot_world
    assert world.robot is not None
    good = world.robot.password
    since = len(robot_log(world))
    _set_password(world, good + "-wrong")
    number = world.add_host()  # needs Robot: activation, reset
    rejected = until(
        "RobotCredentialsValid=False on the HetznerGPUCluster",
        lambda: (c := _credentials_condition(world)) and c["status"] == "False" and c,
        90,
        world,
    )
    assert rejected["reason"] == "CredentialsRejected", rejected
    assert "stopped" in str(rejected["message"]) and good not in str(rejected["message"])
    # Let every loop take a few more passes: not one more request may reach Robot with these credentials.
    settle_from = len(robot_log(world))
    time.sleep(6)
    refused = logins_refused(world, since)
    assert len(refused) == 1, [(e.method, e.path, e.code) for e in refused]
    assert not [e for e in robot_log(world, settle_from) if e.user is None or e.status == 401], "a call after the 401"
    assert not [e for e in robot_log(world, since) if e.code == "BLOCKED"]
    assert status(world, number).get("state") in ("Registering", "Inspecting"), status(world, number)

    # The operator restarts (a crash, a rollout) while the Secret is still wrong: the circuit lived in the old
    # process's memory, the HetznerGPUCluster's status tells the new one, and it sends nothing either.
    log_from = len(world.operator_logs())
    world.kill_operator(9)
    world.start_operator()
    until(
        "the restarted operator to hold the new host back",
        lambda: any(m in world.operator_logs()[log_from:] for m in ("RobotCircuitOpen", "all Robot calls stopped")),
        60,
        world,
    )
    assert len(logins_refused(world, since)) == 1, [(e.method, e.path) for e in logins_refused(world, since)]

    _set_password(world, good)
    until("the new host inspected after the Secret was fixed", lambda: _inspected(world, [number]), 150, world)
    valid = until(
        "RobotCredentialsValid=True again",
        lambda: (c := _credentials_condition(world)) and c["status"] == "True" and c,
        90,
        world,
    )
    assert valid["reason"] == "Ready"
    assert len(logins_refused(world, since)) == 1
    assert len(activations(world, number, since)) == 1 and len(resets(world, number, since)) == 1
    assert host_name(number) in {h["metadata"]["name"] for h in world.hosts()}
