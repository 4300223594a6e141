"""One narrow Kubernetes client, plain dicts in and out, used off the event loop.

Why not the typed models of the official client: they drop fields they don't know, and DRA (binding
conditions, device status) moves faster than the client's release train. Why not a second async
library: the project uses the official ``kubernetes`` package for auth and transport everywhere, and
kopf handlers reach it through ``asyncio.to_thread`` (see ``AsyncKube``). One way, kept.

Errors are translated at this boundary into ``KubeError`` subclasses, so callers branch on meaning
(``NotFound``, ``Conflict``) rather than on HTTP status numbers.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import kubernetes.client
import kubernetes.config
from kubernetes.client.exceptions import ApiException

Obj = dict[str, Any]

MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"


class KubeError(Exception):
    """Root of the API errors; ``status`` and ``reason`` come from the apiserver's Status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(KubeError):
    """The object (or its kind) does not exist."""


class Conflict(KubeError):
    """resourceVersion conflict or AlreadyExists: re-read and retry."""


class Invalid(KubeError):
    """Schema or admission rejected the object."""


class Forbidden(KubeError):
    """RBAC said no."""


def _translate(exc: ApiException) -> KubeError:
    reason, message = "", str(exc.reason or "")
    try:
        body = json.loads(exc.body or "{}")
        reason, message = body.get("reason", ""), body.get("message", message)
    except (ValueError, TypeError):
        pass
    status = int(exc.status or 0)
    cls: type[KubeError] = {404: NotFound, 409: Conflict, 422: Invalid, 403: Forbidden}.get(status, KubeError)
    return cls(status, reason, message)


@dataclass(frozen=True)
class Res:
    """A resource kind: where it lives in the API."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


NODES = Res("", "v1", "nodes", namespaced=False)
PODS = Res("", "v1", "pods")
SECRETS = Res("", "v1", "secrets")
EVENTS = Res("", "v1", "events")
NAMESPACES = Res("", "v1", "namespaces", namespaced=False)
CONFIGMAPS = Res("", "v1", "configmaps")
SERVICEACCOUNTS = Res("", "v1", "serviceaccounts")
RESOURCESLICES = Res("resource.k8s.io", "v1", "resourceslices", namespaced=False)
RESOURCECLAIMS = Res("resource.k8s.io", "v1", "resourceclaims")
RESOURCECLAIMTEMPLATES = Res("resource.k8s.io", "v1", "resourceclaimtemplates")
DEVICECLASSES = Res("resource.k8s.io", "v1", "deviceclasses", namespaced=False)
DEVICETAINTRULES = Res("resource.k8s.io", "v1beta2", "devicetaintrules", namespaced=False)
CRDS = Res("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
CAPI_CLUSTERS = Res("cluster.x-k8s.io", "v1beta2", "clusters")
CAPI_MACHINES = Res("cluster.x-k8s.io", "v1beta2", "machines")
CAPI_MACHINESETS = Res("cluster.x-k8s.io", "v1beta2", "machinesets")
CAPI_MACHINEDEPLOYMENTS = Res("cluster.x-k8s.io", "v1beta2", "machinedeployments")
CAPI_MHCS = Res("cluster.x-k8s.io", "v1beta2", "machinehealthchecks")


def ours(plural: str) -> Res:
    """A resource of this provider's API group."""
    from capi_gpu import domain

    return Res(domain.GROUP, domain.VERSION, plural)


class Kube:
    """Synchronous, dict-based access to one cluster."""

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self._api = api_client

    @classmethod
    def _from_config(cls, cfg: kubernetes.client.Configuration, pool_size: int | None) -> Kube:
        """``pool_size``: connections kept open (the client's default is 5 per CPU); size it for the
        callers' threads plus long-running watches, or every surplus request pays a fresh TLS handshake."""
        if pool_size is not None:
            cfg.connection_pool_maxsize = pool_size
        return cls(kubernetes.client.ApiClient(cfg))

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None, pool_size: int | None = None) -> Kube:
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
        return cls._from_config(cfg, pool_size)

    @classmethod
    def from_kubeconfig_dict(cls, data: Mapping[str, Any], pool_size: int | None = None) -> Kube:
        cfg = kubernetes.client.Configuration()
        loader = kubernetes.config.kube_config.KubeConfigLoader(config_dict=dict(data))
        loader.load_and_set(cfg)
        return cls._from_config(cfg, pool_size)

    @classmethod
    def in_cluster_or_kubeconfig(cls, path: str | None = None, pool_size: int | None = None) -> Kube:
        if path:
            return cls.from_kubeconfig(path, pool_size=pool_size)
        try:
            cfg = kubernetes.client.Configuration()
            kubernetes.config.load_incluster_config(client_configuration=cfg)
            return cls._from_config(cfg, pool_size)
        except kubernetes.config.ConfigException:
            return cls.from_kubeconfig(pool_size=pool_size)

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    def close(self) -> None:
        self._api.close()

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] | None = 30.0,
        stream: bool = False,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        _, url, header_params, ser_body, _post = self._api.param_serialize(
            method, path, query_params=params, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        try:
            resp = self._api.call_api(method, url, header_params=header_params, body=ser_body, _request_timeout=timeout)
        except ApiException as exc:
            raise _translate(exc) from exc
        if resp.status >= 400:
            resp.read()
            raise _translate(ApiException(status=resp.status, reason=resp.reason, body=resp.data))
        if stream:
            return resp.response
        resp.read()
        return json.loads(resp.data) if resp.data else {}

    def get(self, res: Res, name: str, namespace: str | None = None) -> Obj:
        result: Obj = self._call("GET", res.path(namespace, name))
        return result

    def get_or_none(self, res: Res, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return self.get(res, name, namespace)
        except NotFound:
            return None

    def version(self) -> Obj:
        """The apiserver's build (``/version``): the cheapest "does it answer" there is."""
        result: Obj = self._call("GET", "/version", timeout=10.0)
        return result

    def list(
        self,
        res: Res,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        out: list[Obj] = []
        cont: str | None = None
        while True:
            q = {"labelSelector": label_selector, "fieldSelector": field_selector, "limit": 500, "continue": cont}
            page: Obj = self._call("GET", res.path(namespace), query=q)
            out.extend(page.get("items", []))
            cont = page.get("metadata", {}).get("continue")
            if not cont:
                return out

    def create(self, res: Res, obj: Obj, namespace: str | None = None, dry_run: bool = False) -> Obj:
        """``dry_run``: the object as the apiserver would store it (defaulted, pruned), nothing written."""
        result: Obj = self._call("POST", res.path(namespace), body=obj, query={"dryRun": "All"} if dry_run else None)
        return result

    def replace(self, res: Res, obj: Obj, namespace: str | None = None, sub: str | None = None) -> Obj:
        name = obj["metadata"]["name"]
        result: Obj = self._call("PUT", res.path(namespace, name, sub), body=obj)
        return result

    def patch(
        self,
        res: Res,
        name: str,
        patch: Any,
        namespace: str | None = None,
        sub: str | None = None,
        content_type: str = MERGE_PATCH,
    ) -> Obj:
        result: Obj = self._call("PATCH", res.path(namespace, name, sub), body=patch, content_type=content_type)
        return result

    def apply_patch(
        self,
        res: Res,
        name: str,
        body: Obj,
        manager: str,
        namespace: str | None = None,
        sub: str | None = None,
        force: bool = True,
    ) -> Obj:
        """Server-side apply: own only the fields in ``body`` (e.g. one condition in a map-typed list)."""
        path = res.path(namespace, name, sub) + f"?fieldManager={manager}" + ("&force=true" if force else "")
        result: Obj = self._call("PATCH", path, body=body, content_type=APPLY_PATCH)
        return result

    def delete(
        self,
        res: Res,
        name: str,
        namespace: str | None = None,
        missing_ok: bool = True,
        grace_period_seconds: int | None = None,
    ) -> None:
        """``grace_period_seconds=0`` deletes a pod at once, without waiting for its kubelet to confirm."""
        try:
            self._call("DELETE", res.path(namespace, name), query={"gracePeriodSeconds": grace_period_seconds})
        except NotFound:
            if not missing_ok:
                raise

    def apply(self, res: Res, obj: Obj, namespace: str | None = None) -> Obj:
        """Create, or merge-patch an existing object (idempotent, used by installers and tests)."""
        try:
            return self.create(res, obj, namespace)
        except Conflict:
            return self.patch(res, obj["metadata"]["name"], obj, namespace)

    def watch(
        self,
        res: Res,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        stop: threading.Event | None = None,
    ) -> Iterator[tuple[str, Obj]]:
        """Yields (type, object) from one watch request; ends when the server closes it."""
        q = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "timeoutSeconds": timeout_seconds,
        }
        resp = self._call("GET", res.path(namespace), query=q, timeout=(10, timeout_seconds + 10), stream=True)
        try:
            buf = b""
            for chunk in resp.stream(4096, decode_content=True):
                if stop is not None and stop.is_set():
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        ev = json.loads(line)
                        yield ev["type"], ev["object"]
        finally:
            resp.release_conn()


class AsyncKube:
    """The same client for kopf's event loop: every call runs on a bounded thread pool."""

    def __init__(self, kube: Kube, workers: int = 16) -> None:
        self.sync = kube
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def get(self, res: Res, name: str, namespace: str | None = None) -> Obj:
        result: Obj = await self._run(self.sync.get, res, name, namespace)
        return result

    async def get_or_none(self, res: Res, name: str, namespace: str | None = None) -> Obj | None:
        result: Obj | None = await self._run(self.sync.get_or_none, res, name, namespace)
        return result

    async def list(
        self,
        res: Res,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        result: list[Obj] = await self._run(self.sync.list, res, namespace, label_selector, field_selector)
        return result

    async def create(self, res: Res, obj: Obj, namespace: str | None = None, dry_run: bool = False) -> Obj:
        result: Obj = await self._run(self.sync.create, res, obj, namespace, dry_run)
        return result

    async def patch(
        self,
        res: Res,
        name: str,
        patch: Any,
        namespace: str | None = None,
        sub: str | None = None,
        content_type: str = MERGE_PATCH,
    ) -> Obj:
        result: Obj = await self._run(self.sync.patch, res, name, patch, namespace, sub, content_type)
        return result

    async def replace(self, res: Res, obj: Obj, namespace: str | None = None, sub: str | None = None) -> Obj:
        result: Obj = await self._run(self.sync.replace, res, obj, namespace, sub)
        return result

    async def apply_patch(
        self, res: Res, name: str, body: Obj, manager: str, namespace: str | None = None, sub: str | None = None
    ) -> Obj:
        result: Obj = await self._run(self.sync.apply_patch, res, name, body, manager, namespace, sub)
        return result

    async def delete(self, res: Res, name: str, namespace: str | None = None) -> None:
        await self._run(self.sync.delete, res, name, namespace)

    async def apply(self, res: Res, obj: Obj, namespace: str | None = None) -> Obj:
        result: Obj = await self._run(self.sync.apply, res, obj, namespace)
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.sync.close()
