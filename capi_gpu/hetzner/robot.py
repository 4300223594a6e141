"""The Robot webservice client the controllers use: narrow Protocols, one async implementation.

``RobotAPI`` is what provisioning needs (servers, reset, rescue, keys, vSwitch membership),
``RobotVSwitchAPI`` what a cluster's private network needs (the vSwitch itself and its members), and
``RobotOrderAPI`` what the ops CLI needs (products, orders, cancellations); ``RobotClient`` implements all on
``RobotSession`` (``transport.py``), which holds the rules every call obeys: circuit, budget, retry.

Here we only know endpoints: form fields (arrays as ``name[]``), which object name wraps the answer
(vSwitch answers are not wrapped), and which "not found" means "empty list". A client is cheap; the
expensive shared state (budget, circuit, server cache) lives in the account it gets from the
registry, so every client for the same Robot user shares it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

import httpx
import pydantic

from capi_gpu.hetzner import account as account_mod
from capi_gpu.hetzner import budget, errors, models, transport
from capi_gpu.hetzner.transport import Retry

_M = TypeVar("_M", bound=pydantic.BaseModel)


def md5_fingerprint(public_key: str) -> str:
    """Robot's key fingerprint: MD5 of the OpenSSH key blob, hex pairs joined by colons."""
    try:
        blob = base64.b64decode(public_key.split()[1], validate=True)
    except (IndexError, binascii.Error) as exc:
        raise ValueError("not an OpenSSH public key line") from exc
    digest = hashlib.md5(blob, usedforsecurity=False).hexdigest()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def _invalid(exc: Exception, what: str) -> errors.RobotTerminalError:
    return errors.RobotTerminalError(None, "INVALID_RESPONSE", f"unexpected {what} body: {type(exc).__name__}")


def _one(body: Any, name: str | None, model: type[_M]) -> _M:
    try:
        inner = body[name] if name is not None else body
        return model.model_validate(inner)
    except (KeyError, TypeError, pydantic.ValidationError) as exc:
        raise _invalid(exc, name or model.__name__) from exc


def _many(body: Any, name: str | None, model: type[_M]) -> list[_M]:
    if not isinstance(body, list):
        raise _invalid(TypeError(type(body).__name__), f"list of {name or model.__name__}")
    return [_one(item, name, model) for item in body]


class RobotAPI(Protocol):
    """What provisioning asks of Robot. Reads of server state go through the account-wide cache."""

    @property
    def account(self) -> account_mod.RobotAccount: ...

    async def cached_servers(self) -> Mapping[int, models.Server]: ...
    async def cached_server(self, server_number: int) -> models.Server: ...
    async def get_server(self, server_number: int) -> models.Server: ...
    async def rename_server(self, server_number: int, name: str) -> models.Server: ...
    async def get_reset(self, server_number: int) -> models.Reset: ...
    async def reset(self, server_number: int, kind: models.ResetType) -> models.ResetResult: ...
    async def get_rescue(self, server_number: int) -> models.Rescue: ...
    async def enable_rescue(self, server_number: int, fingerprints: Sequence[str]) -> models.Rescue: ...
    async def disable_rescue(self, server_number: int) -> models.Rescue: ...
    async def ensure_key(self, name: str, public_key: str) -> str: ...
    async def get_vswitch(self, vswitch_id: int) -> models.VSwitch: ...
    async def add_vswitch_servers(self, vswitch_id: int, server_numbers: Sequence[int]) -> None: ...
    async def remove_vswitch_servers(self, vswitch_id: int, server_numbers: Sequence[int]) -> None: ...


class RobotVSwitchAPI(Protocol):
    """A cluster's private network: the vSwitch itself (create, rename, cancel) and its members.

    Membership is asynchronous: after an add or a remove the server is ``processing`` until Robot has
    configured the switch port, and every change to the vSwitch meanwhile is 409 ``VSWITCH_IN_PROCESS``
    (a ``RobotRequeue``). So callers read (``get_vswitch``), decide (``vswitch_plan``), send one change,
    and come back later; nothing here waits.
    """

    async def list_vswitches(self) -> list[models.VSwitch]: ...
    async def create_vswitch(self, name: str, vlan: int) -> models.VSwitch: ...
    async def get_vswitch(self, vswitch_id: int) -> models.VSwitch: ...
    async def update_vswitch(self, vswitch_id: int, *, name: str, vlan: int) -> None: ...
    async def cancel_vswitch(self, vswitch_id: int, *, date: str = "now") -> None: ...
    async def add_vswitch_servers(self, vswitch_id: int, server_numbers: Sequence[int]) -> None: ...
    async def remove_vswitch_servers(self, vswitch_id: int, server_numbers: Sequence[int]) -> None: ...


class RobotOrderAPI(Protocol):
    """Ops actions that cost money or end a lease; never part of a scale-up."""

    async def list_products(self, *, location: str | None = None) -> list[models.Product]: ...
    async def get_product(self, product_id: str) -> models.Product: ...
    async def order_server(self, order: models.OrderRequest, *, test: bool) -> models.Transaction: ...
    async def list_transactions(self) -> list[models.Transaction]: ...
    async def get_transaction(self, transaction_id: str) -> models.Transaction: ...
    async def get_cancellation(self, server_number: int) -> models.Cancellation: ...
    async def cancel_server(
        self,
        server_number: int,
        *,
        date: str = "now",
        reason: str | None = None,
        reserve_location: bool = False,
    ) -> models.Cancellation: ...


class RobotClient:
    """Async Robot client. ``async with RobotClient(user, pw) as robot: ...``."""

    def __init__(
        self,
        username: str,
        password: str,
        *,
        base_url: str = transport.ROBOT_URL,
        registry: account_mod.AccountRegistry | None = None,
        share: float = 1.0,
        limits: Mapping[budget.Family, budget.Limit] | None = None,
        server_ttl_s: float = 60.0,
        http_transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 30.0,
        retry: transport.RetryPolicy | None = None,
        backoff: transport.Backoff | None = None,
        sleep: transport.Sleep | None = None,
    ) -> None:
        transport.check_url(base_url)  # before anything is registered for this account
        registry = registry or account_mod.default_registry()
        self._account = registry.account(username, share=share, limits=limits, server_ttl_s=server_ttl_s)
        extra: dict[str, Any] = {"sleep": sleep} if sleep is not None else {}
        self._session = transport.RobotSession(
            username,
            password,
            base_url=base_url,
            account=self._account,
            transport=http_transport,
            timeout_s=timeout_s,
            retry=retry,
            backoff=backoff,
            **extra,
        )

    @property
    def account(self) -> account_mod.RobotAccount:
        return self._account

    @property
    def credentials_fingerprint(self) -> str:
        return self._session.credentials_fingerprint

    def __repr__(self) -> str:
        return f"RobotClient({self._session!r})"

    async def __aenter__(self) -> RobotClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._session.aclose()

    async def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return await self._session.call("GET", path, retry=Retry.SAFE, params=params)

    async def _list(self, path: str, name: str, model: type[_M], params: Mapping[str, str] | None = None) -> list[_M]:
        """A wrapped list, where Robot answers "you have none" with a 404 (``SERVER_NOT_FOUND``, ...)."""
        try:
            body = await self._get(path, params)
        except errors.RobotNotFound:
            return []
        return _many(body, name, model)

    # --- servers -------------------------------------------------------------------------------

    async def list_servers(self) -> list[models.Server]:
        return await self._list("/server", "server", models.Server)

    async def cached_servers(self) -> Mapping[int, models.Server]:
        return await self._account.servers.servers(self.list_servers)

    async def cached_server(self, server_number: int) -> models.Server:
        """From the account's list cache; a number the list lacks costs one GET per cache TTL."""
        servers = await self.cached_servers()
        if server_number in servers:
            return servers[server_number]
        if self._account.servers.is_known_missing(server_number):
            raise errors.RobotNotFound(404, "SERVER_NOT_FOUND", f"server {server_number} not in account")
        try:
            server = await self.get_server(server_number)
        except errors.RobotNotFound:
            self._account.servers.mark_missing(server_number)
            raise
        self._account.servers.update(server)
        return server

    async def get_server(self, server_number: int) -> models.Server:
        return _one(await self._get(f"/server/{server_number}"), "server", models.Server)

    async def rename_server(self, server_number: int, name: str) -> models.Server:
        body = await self._session.call(
            "POST", f"/server/{server_number}", retry=Retry.SAFE, data={"server_name": name}
        )
        server = _one(body, "server", models.Server)
        self._account.servers.update(server)
        return server

    # --- reset ---------------------------------------------------------------------------------

    async def list_resets(self) -> list[models.Reset]:
        return await self._list("/reset", "reset", models.Reset)

    async def get_reset(self, server_number: int) -> models.Reset:
        return _one(await self._get(f"/reset/{server_number}"), "reset", models.Reset)

    async def reset(self, server_number: int, kind: models.ResetType) -> models.ResetResult:
        body = await self._session.call(
            "POST", f"/reset/{server_number}", retry=Retry.UNLESS_APPLIED, data={"type": kind.value}
        )
        return _one(body, "reset", models.ResetResult)

    # --- rescue --------------------------------------------------------------------------------

    async def get_rescue(self, server_number: int) -> models.Rescue:
        return _one(await self._get(f"/boot/{server_number}/rescue"), "rescue", models.Rescue)

    async def activate_rescue(
        self,
        server_number: int,
        fingerprints: Sequence[str],
        *,
        os: str = "linux",
        keyboard: str | None = None,
    ) -> models.Rescue:
        """``POST /boot/{n}/rescue``: takes effect at the next boot (follow with ``reset``)."""
        data: dict[str, str | list[str]] = {"os": os}
        if fingerprints:
            data["authorized_key[]"] = list(fingerprints)
        if keyboard is not None:
            data["keyboard"] = keyboard
        body = await self._session.call("POST", f"/boot/{server_number}/rescue", retry=Retry.UNLESS_APPLIED, data=data)
        return _one(body, "rescue", models.Rescue)

    async def disable_rescue(self, server_number: int) -> models.Rescue:
        body = await self._session.call("DELETE", f"/boot/{server_number}/rescue", retry=Retry.SAFE)
        return _one(body, "rescue", models.Rescue)

    async def enable_rescue(self, server_number: int, fingerprints: Sequence[str]) -> models.Rescue:
        """Activate rescue with exactly these keys; one call unless an older activation is in the way.

        An activation that is already there (409) or that came back without our keys is deleted and
        made again, as CAPH does, so the password and host keys always belong to this activation.
        """
        try:
            rescue = await self.activate_rescue(server_number, fingerprints)
        except errors.RobotConflict:
            rescue = None
        if rescue is not None and set(fingerprints) <= set(rescue.authorized_fingerprints):
            return rescue
        await self.disable_rescue(server_number)
        return await self.activate_rescue(server_number, fingerprints)

    # --- keys ----------------------------------------------------------------------------------

    async def list_keys(self) -> list[models.Key]:
        return await self._list("/key", "key", models.Key)

    async def get_key(self, fingerprint: str) -> models.Key:
        return _one(await self._get(f"/key/{fingerprint}"), "key", models.Key)

    async def create_key(self, name: str, public_key: str) -> models.Key:
        body = await self._session.call(
            "POST", "/key", retry=Retry.UNLESS_APPLIED, data={"name": name, "data": public_key}
        )
        return _one(body, "key", models.Key)

    async def ensure_key(self, name: str, public_key: str) -> str:
        """The Robot fingerprint of ``public_key``, uploading it if needed; free after the first time."""
        fingerprint = md5_fingerprint(public_key)
        if fingerprint in self._account.known_keys:
            return fingerprint
        async with self._account.lock(f"key:{fingerprint}"):  # 100 hosts at once: one lookup
            if fingerprint in self._account.known_keys:
                return fingerprint
            try:
                fingerprint = (await self.get_key(fingerprint)).fingerprint
            except errors.RobotNotFound:
                # KEY_ALREADY_EXISTS: another process won the race; the fingerprint is the same.
                with contextlib.suppress(errors.RobotConflict):
                    fingerprint = (await self.create_key(name, public_key)).fingerprint
            self._account.known_keys.add(fingerprint)
            return fingerprint

    # --- ordering ------------------------------------------------------------------------------

    async def list_products(self, *, location: str | None = None) -> list[models.Product]:
        params = {"location": location} if location else None
        return await self._list("/order/server/product", "product", models.Product, params)

    async def get_product(self, product_id: str) -> models.Product:
        return _one(await self._get(f"/order/server/product/{product_id}"), "product", models.Product)

    async def order_server(self, order: models.OrderRequest, *, test: bool) -> models.Transaction:
        """``POST /order/server/transaction``; ``test=True`` is Robot's dry run. Never retried."""
        body = await self._session.call(
            "POST", "/order/server/transaction", retry=Retry.NEVER, data=order.form(test=test)
        )
        return _one(body, "transaction", models.Transaction)

    async def list_transactions(self) -> list[models.Transaction]:
        return await self._list("/order/server/transaction", "transaction", models.Transaction)

    async def get_transaction(self, transaction_id: str) -> models.Transaction:
        body = await self._get(f"/order/server/transaction/{transaction_id}")
        return _one(body, "transaction", models.Transaction)

    async def get_cancellation(self, server_number: int) -> models.Cancellation:
        body = await self._get(f"/server/{server_number}/cancellation")
        return _one(body, "cancellation", models.Cancellation)

    async def cancel_server(
        self,
        server_number: int,
        *,
        date: str = "now",
        reason: str | None = None,
        reserve_location: bool = False,
    ) -> models.Cancellation:
        data = {"cancellation_date": date, "reserve_location": "true" if reserve_location else "false"}
        if reason is not None:
            data["cancellation_reason"] = reason
        body = await self._session.call(
            "POST", f"/server/{server_number}/cancellation", retry=Retry.UNLESS_APPLIED, data=data
        )
        return _one(body, "cancellation", models.Cancellation)

    # --- vSwitch (answers are not wrapped) ---------------------------------------------------
    # Reads cost the vswitch_read family (500/h), every change vswitch_write (100/h, the smallest of the
    # write endpoints' limits). A change that may have been applied is never resent blindly: the caller's
    # next read shows whether it was (a resent add would meet its own server ``processing``: 409).

    async def list_vswitches(self) -> list[models.VSwitch]:
        """Every vSwitch of the account, cancelled ones included, without their members."""
        return _many(await self._get("/vswitch"), None, models.VSwitch)

    async def create_vswitch(self, name: str, vlan: int) -> models.VSwitch:
        """``POST /vswitch`` (201). 409 ``VSWITCH_LIMIT_REACHED`` / ``VSWITCH_VLAN_NOT_UNIQUE`` are terminal."""
        self._account.vswitch_list = None  # sent or not, the cached list may be stale now
        body = await self._session.call(
            "POST", "/vswitch", retry=Retry.UNLESS_APPLIED, data={"name": name, "vlan": str(vlan)}
        )
        return _one(body, None, models.VSwitch)

    async def get_vswitch(self, vswitch_id: int) -> models.VSwitch:
        return _one(await self._get(f"/vswitch/{vswitch_id}"), None, models.VSwitch)

    async def cached_vswitch(self, vswitch_id: int) -> models.VSwitch:
        """``GET /vswitch/{id}`` shared by every caller of the account for ``vswitch_ttl_s`` (single flight);
        a change we send drops it, so the next read shows the change."""
        acct = self._account
        async with acct.lock(f"vswitch-read/{vswitch_id}"):
            hit = acct.vswitch_reads.get(vswitch_id)
            if hit is not None and acct.clock() - hit[0] < acct.vswitch_ttl_s:
                return hit[1]
            changes = acct.vswitch_changes.get(vswitch_id, 0)
            fresh = await self.get_vswitch(vswitch_id)
            if acct.vswitch_changes.get(vswitch_id, 0) == changes:  # a change sent meanwhile: not kept
                acct.vswitch_reads[vswitch_id] = (acct.clock(), fresh)
            return fresh

    async def cached_vswitch_list(self) -> list[models.VSwitch]:
        """``GET /vswitch`` shared by every caller of the account for ``vswitch_ttl_s``; a create or a cancel
        we send drops it."""
        acct = self._account
        async with acct.lock("vswitch-list"):
            hit = acct.vswitch_list
            if hit is not None and acct.clock() - hit[0] < acct.vswitch_ttl_s:
                return hit[1]
            fresh = await self.list_vswitches()
            acct.vswitch_list = (acct.clock(), fresh)
            return fresh

    def forget_vswitch(self, vswitch_id: int) -> None:
        acct = self._account
        acct.vswitch_reads.pop(vswitch_id, None)
        acct.vswitch_changes[vswitch_id] = acct.vswitch_changes.get(vswitch_id, 0) + 1

    async def update_vswitch(self, vswitch_id: int, *, name: str, vlan: int) -> None:
        """``POST /vswitch/{id}``: Robot wants both fields every time. Idempotent, so retried freely."""
        data = {"name": name, "vlan": str(vlan)}
        await self._session.call("POST", f"/vswitch/{vswitch_id}", retry=Retry.SAFE, data=data)

    async def cancel_vswitch(self, vswitch_id: int, *, date: str = "now") -> None:
        """``DELETE /vswitch/{id}`` with ``cancellation_date`` ("yyyy-MM-dd" or "now")."""
        data = {"cancellation_date": date}
        self.forget_vswitch(vswitch_id)  # sent or not, the cached read may be stale now
        self._account.vswitch_list = None
        await self._session.call("DELETE", f"/vswitch/{vswitch_id}", retry=Retry.UNLESS_APPLIED, data=data)

    async def add_vswitch_servers(self, vswitch_id: int, server_numbers: Sequence[int]) -> None:
        data = {"server[]": [str(number) for number in server_numbers]}
        self.forget_vswitch(vswitch_id)  # sent or not, the cached read may be stale now
        await self._session.call("POST", f"/vswitch/{vswitch_id}/server", retry=Retry.UNLESS_APPLIED, data=data)

    async def remove_vswitch_servers(self, vswitch_id: int, server_numbers: Sequence[int]) -> None:
        data = {"server[]": [str(number) for number in server_numbers]}
        self.forget_vswitch(vswitch_id)  # sent or not, the cached read may be stale now
        await self._session.call("DELETE", f"/vswitch/{vswitch_id}/server", retry=Retry.UNLESS_APPLIED, data=data)
