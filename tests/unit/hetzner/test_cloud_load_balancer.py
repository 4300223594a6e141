"""Control-plane Load Balancer through real hcloud-python against the loopback fake: create with ip
targets and a TCP 6443 service + TCP health check, adopt an existing one by name and converge it,
add/remove targets, delete, and errors translated into CloudError (retryable or not)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from capi_gpu.hetzner import cloud
from capi_gpu_sim.hcloud import FakeHCloud

SPEC = cloud.LoadBalancerSpec(name="wl-1-kube-apiserver", location="fsn1", labels={"cluster": "wl-1"})


@pytest.fixture
def fake() -> Iterator[FakeHCloud]:
    with FakeHCloud(action_polls=2) as running:
        yield running


@pytest.fixture
def lbs(fake: FakeHCloud) -> cloud.HCloudLoadBalancers:
    return cloud.HCloudLoadBalancers(fake.token, api_endpoint=fake.url, poll_interval_s=0.001)


def only_lb(fake: FakeHCloud) -> Any:
    (lb,) = fake.load_balancers.values()
    return lb


async def test_ensure_creates_the_endpoint(fake: FakeHCloud, lbs: cloud.HCloudLoadBalancers) -> None:
    endpoint = await lbs.ensure(SPEC, ["192.0.2.10", "192.0.2.11", "192.0.2.10"])
    lb = only_lb(fake)
    assert endpoint == cloud.Endpoint(host=lb["public_net"]["ipv4"]["ip"], port=6443)
    assert [t["ip"]["ip"] for t in lb["targets"]] == ["192.0.2.10", "192.0.2.11"]
    (service,) = lb["services"]
    assert (service["protocol"], service["listen_port"], service["destination_port"]) == ("tcp", 6443, 6443)
    assert service["health_check"] == {"protocol": "tcp", "port": 6443, "interval": 15, "timeout": 10, "retries": 3}
    assert lb["labels"] == {"cluster": "wl-1"}
    assert any(path.startswith("/actions/") for _, path in fake.requests), "did not wait for the create action"


async def test_ensure_adopts_by_name_and_converges(fake: FakeHCloud, lbs: cloud.HCloudLoadBalancers) -> None:
    await lbs.ensure(cloud.LoadBalancerSpec(name=SPEC.name, port=8443), ["192.0.2.10", "192.0.2.12"])
    created = len(fake.requests)
    endpoint = await lbs.ensure(SPEC, ["192.0.2.10", "192.0.2.11"])
    lb = only_lb(fake)
    assert sorted(t["ip"]["ip"] for t in lb["targets"]) == ["192.0.2.10", "192.0.2.11"]
    assert {s["listen_port"] for s in lb["services"]} == {8443, 6443}
    assert endpoint.port == 6443
    assert ("POST", "/load_balancers") not in fake.requests[created:]
    # Nothing left to change: a second ensure only reads.
    before = len(fake.requests)
    assert await lbs.ensure(SPEC, ["192.0.2.11", "192.0.2.10"]) == endpoint
    assert all(method == "GET" for method, _ in fake.requests[before:])


async def test_a_wrong_health_check_is_fixed(fake: FakeHCloud, lbs: cloud.HCloudLoadBalancers) -> None:
    await lbs.ensure(cloud.LoadBalancerSpec(name=SPEC.name, health_interval_s=60), [])
    await lbs.ensure(SPEC, [])
    (service,) = only_lb(fake)["services"]
    assert service["health_check"]["interval"] == 15


async def test_targets_come_and_go(fake: FakeHCloud, lbs: cloud.HCloudLoadBalancers) -> None:
    await lbs.ensure(SPEC, ["192.0.2.10"])
    await lbs.add_target(SPEC.name, "192.0.2.11")
    await lbs.add_target(SPEC.name, "192.0.2.11")  # idempotent
    await lbs.remove_target(SPEC.name, "192.0.2.10")
    await lbs.remove_target(SPEC.name, "192.0.2.10")
    assert [t["ip"]["ip"] for t in only_lb(fake)["targets"]] == ["192.0.2.11"]
    assert await lbs.endpoint(SPEC.name) == await lbs.ensure(SPEC, ["192.0.2.11"])


async def test_delete(fake: FakeHCloud, lbs: cloud.HCloudLoadBalancers) -> None:
    await lbs.ensure(SPEC, [])
    assert await lbs.delete(SPEC.name) is True
    assert fake.load_balancers == {}
    assert await lbs.delete(SPEC.name) is False
    assert await lbs.endpoint(SPEC.name) is None


async def test_errors_are_translated(fake: FakeHCloud, lbs: cloud.HCloudLoadBalancers) -> None:
    with pytest.raises(cloud.CloudError) as missing:
        await lbs.add_target("nope", "192.0.2.10")
    assert (missing.value.code, missing.value.retryable) == ("not_found", False)
    with pytest.raises(cloud.CloudError) as bad:
        await lbs.ensure(cloud.LoadBalancerSpec(name="x", location="mars"), [])
    assert (bad.value.code, bad.value.retryable) == ("invalid_input", False)
    assert bad.value.correlation_id is not None
    fake.fail_next_action = True
    with pytest.raises(cloud.CloudError) as failed:
        await lbs.ensure(SPEC, [])
    assert (failed.value.code, failed.value.retryable) == ("action_failed", True)
    wrong_token = cloud.HCloudLoadBalancers("not-the-token", api_endpoint=fake.url)
    with pytest.raises(cloud.CloudError) as denied:
        await wrong_token.endpoint(SPEC.name)
    assert denied.value.code == "unauthorized"
    assert "not-the-token" not in str(denied.value) + repr(wrong_token)
