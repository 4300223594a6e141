"""A Hetzner Cloud Load Balancer in front of the control plane, through the ``hcloud`` package.

Hetzner Cloud has no GPU servers, but it can give a cluster of Robot machines a stable API endpoint:
a Load Balancer with one ``ip`` target per control-plane host (Robot servers of the same account are
allowed as ip targets) and a TCP service on 6443 with a TCP health check, as CAPH does for bare-metal
control planes. ``LoadBalancerAPI`` is the narrow port the cluster controller uses; it returns the
``(host, port)`` that becomes ``spec.controlPlaneEndpoint``.

``ensure`` is idempotent and *adopts* a Load Balancer that already has the name (one a previous
controller created, or one an operator made by hand): it adds the 6443 service if it is missing,
fixes its health check, and converges the ip targets to the given set. Server and label-selector
targets are left alone: we only own the ip targets.

hcloud is synchronous (``requests``); every call runs in a worker thread so kopf's loop never
blocks. Its errors are translated here into ``CloudError`` (``raise ... from exc``), retryable or not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import hcloud
import requests
from hcloud.actions import ActionFailedException, ActionTimeoutException
from hcloud.load_balancer_types import LoadBalancerType
from hcloud.load_balancers import (
    LoadBalancerHealthCheck,
    LoadBalancerService,
    LoadBalancerTarget,
    LoadBalancerTargetIP,
)
from hcloud.locations import Location

API_PORT = 6443

# hcloud error codes worth another try later (hcloud-python's own retry list, plus locking).
_RETRYABLE = frozenset({"rate_limit_exceeded", "locked", "conflict", "timeout", "maintenance", "resource_unavailable"})


class CloudError(Exception):
    """Root of Cloud failures; ``retryable`` says whether a requeue can help."""

    def __init__(self, code: str, message: str, *, retryable: bool, correlation_id: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.correlation_id = correlation_id


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int


@dataclass(frozen=True)
class LoadBalancerSpec:
    name: str
    location: str = "fsn1"
    lb_type: str = "lb11"
    port: int = API_PORT
    labels: Mapping[str, str] = field(default_factory=dict)
    health_interval_s: int = 15
    health_timeout_s: int = 10
    health_retries: int = 3


class LoadBalancerAPI(Protocol):
    async def ensure(self, spec: LoadBalancerSpec, target_ips: Sequence[str]) -> Endpoint: ...
    async def endpoint(self, name: str, port: int = API_PORT) -> Endpoint | None: ...
    async def add_target(self, name: str, ip: str) -> None: ...
    async def remove_target(self, name: str, ip: str) -> None: ...
    async def delete(self, name: str) -> bool: ...


def _translate(exc: Exception) -> CloudError:
    if isinstance(exc, hcloud.APIException):
        code = str(exc.code)
        retryable = code in _RETRYABLE or (code.isdigit() and int(code) >= 500)
        return CloudError(code, exc.message, retryable=retryable, correlation_id=exc.correlation_id)
    if isinstance(exc, ActionFailedException):
        error: Mapping[str, Any] = exc.action.error or {}
        return CloudError(str(error.get("code", "action_failed")), exc.message, retryable=True)
    if isinstance(exc, ActionTimeoutException):
        return CloudError("action_timeout", exc.message, retryable=True)
    return CloudError("transport_error", type(exc).__name__, retryable=True)


def _service(spec: LoadBalancerSpec) -> LoadBalancerService:
    health = LoadBalancerHealthCheck(
        protocol="tcp",
        port=spec.port,
        interval=spec.health_interval_s,
        timeout=spec.health_timeout_s,
        retries=spec.health_retries,
    )
    return LoadBalancerService(
        protocol="tcp", listen_port=spec.port, destination_port=spec.port, proxyprotocol=False, health_check=health
    )


def _ip_target(ip: str) -> LoadBalancerTarget:
    return LoadBalancerTarget(type="ip", ip=LoadBalancerTargetIP(ip=ip))


def _health_matches(service: Any, wanted: LoadBalancerService) -> bool:
    have, want = service.health_check, wanted.health_check
    fields = ("protocol", "port", "interval", "timeout", "retries")
    return have is not None and all(getattr(have, f) == getattr(want, f) for f in fields)


def _public_ipv4(lb: Any) -> str:
    public = lb.public_net
    if public is None or public.ipv4 is None or not public.ipv4.ip:
        raise hcloud.APIException(code="missing_ipv4", message="load balancer has no public IPv4", details=None)
    return str(public.ipv4.ip)


class HCloudLoadBalancers:
    """``LoadBalancerAPI`` on hcloud-python. Pass ``api_endpoint`` to aim it at a fake."""

    def __init__(
        self,
        token: str,
        *,
        api_endpoint: str = "https://api.hetzner.cloud/v1",
        poll_interval_s: float = 1.0,
        action_retries: int = 120,
    ) -> None:
        self._client = hcloud.Client(
            token=token,
            api_endpoint=api_endpoint,
            application_name="capi-gpu",
            poll_interval=poll_interval_s,
            poll_max_retries=action_retries,
        )

    def __repr__(self) -> str:
        return "HCloudLoadBalancers()"

    async def _run(self, fn: Any, *args: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args)
        except (hcloud.HCloudException, requests.RequestException) as exc:
            raise _translate(exc) from exc

    # The _sync_* methods run in a worker thread.

    def _find(self, name: str) -> Any:
        return self._client.load_balancers.get_by_name(name)

    def _sync_ensure(self, spec: LoadBalancerSpec, target_ips: Sequence[str]) -> Endpoint:
        lb = self._find(spec.name)
        wanted = _service(spec)
        if lb is None:
            created = self._client.load_balancers.create(
                name=spec.name,
                load_balancer_type=LoadBalancerType(name=spec.lb_type),
                location=Location(name=spec.location),
                services=[wanted],
                targets=[_ip_target(ip) for ip in dict.fromkeys(target_ips)],
                labels=dict(spec.labels),
                public_interface=True,
            )
            created.action.wait_until_finished()
            lb = created.load_balancer
        else:
            self._adopt(lb, wanted, target_ips)
        return Endpoint(_public_ipv4(self._client.load_balancers.get_by_id(lb.id)), spec.port)

    def _adopt(self, lb: Any, wanted: LoadBalancerService, target_ips: Sequence[str]) -> None:
        service = next((s for s in lb.services or [] if s.listen_port == wanted.listen_port), None)
        if service is None:
            lb.add_service(wanted).wait_until_finished()
        elif service.protocol != "tcp" or not _health_matches(service, wanted):
            lb.update_service(wanted).wait_until_finished()
        have = {t.ip.ip for t in lb.targets or [] if t.type == "ip" and t.ip is not None}
        for ip in dict.fromkeys(target_ips):
            if ip not in have:
                lb.add_target(_ip_target(ip)).wait_until_finished()
        for ip in have - set(target_ips):
            lb.remove_target(_ip_target(ip)).wait_until_finished()

    def _sync_endpoint(self, name: str, port: int) -> Endpoint | None:
        lb = self._find(name)
        return None if lb is None else Endpoint(_public_ipv4(lb), port)

    def _sync_add(self, name: str, ip: str) -> None:
        lb = self._require(name)
        if ip not in {t.ip.ip for t in lb.targets or [] if t.type == "ip" and t.ip is not None}:
            lb.add_target(_ip_target(ip)).wait_until_finished()

    def _sync_remove(self, name: str, ip: str) -> None:
        lb = self._require(name)
        if ip in {t.ip.ip for t in lb.targets or [] if t.type == "ip" and t.ip is not None}:
            lb.remove_target(_ip_target(ip)).wait_until_finished()

    def _sync_delete(self, name: str) -> bool:
        lb = self._find(name)
        if lb is None:
            return False
        self._client.load_balancers.delete(lb)
        return True

    def _require(self, name: str) -> Any:
        lb = self._find(name)
        if lb is None:
            raise hcloud.APIException(code="not_found", message=f"load balancer {name!r} not found", details=None)
        return lb

    # --- LoadBalancerAPI -----------------------------------------------------------------------

    async def ensure(self, spec: LoadBalancerSpec, target_ips: Sequence[str]) -> Endpoint:
        endpoint: Endpoint = await self._run(self._sync_ensure, spec, list(target_ips))
        return endpoint

    async def endpoint(self, name: str, port: int = API_PORT) -> Endpoint | None:
        found: Endpoint | None = await self._run(self._sync_endpoint, name, port)
        return found

    async def add_target(self, name: str, ip: str) -> None:
        await self._run(self._sync_add, name, ip)

    async def remove_target(self, name: str, ip: str) -> None:
        await self._run(self._sync_remove, name, ip)

    async def delete(self, name: str) -> bool:
        deleted: bool = await self._run(self._sync_delete, name)
        return deleted
