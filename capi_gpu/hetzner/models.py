"""Pydantic models of the Robot objects we use, after unwrapping (``{"server": {...}}`` → ``Server``).

They carry the documented fields (robot.hetzner.com/doc/webservice, via ``shared/reference/hetzner.md``)
and ignore anything else, because Robot adds fields over time and the published examples already
differ from the doc (``@deprecated arch``, ``os`` as a string or a list). Lists that Robot sends as
``null`` become empty lists, so callers never branch on None for "nothing".

Secrets Robot hands back (the rescue root password) are ``SecretStr``: a model that ends up in a log
line or an exception shows ``**********``.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, field_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


def _none_to_list(value: Any) -> Any:
    return [] if value is None else value


_T = TypeVar("_T")
NullableList = Annotated[list[_T], BeforeValidator(_none_to_list)]


class ServerStatus(StrEnum):
    READY = "ready"
    IN_PROCESS = "in process"
    UNKNOWN = "unknown"


class ResetType(StrEnum):
    """``POST /reset/{n}`` types. ``man`` emails a technician: never from automation."""

    SOFTWARE = "sw"
    HARDWARE = "hw"
    MANUAL = "man"
    POWER = "power"
    POWER_LONG = "power_long"


class TransactionStatus(StrEnum):
    IN_PROCESS = "in process"
    READY = "ready"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


def _enum_or_unknown(enum: type[StrEnum], value: Any) -> Any:
    values = {member.value for member in enum}
    return value if value in values else "unknown"


class Subnet(_Model):
    ip: str
    mask: str

    @field_validator("mask", mode="before")
    @classmethod
    def _mask_as_str(cls, value: Any) -> Any:
        return str(value)


class Server(_Model):
    """``GET /server`` and ``GET /server/{n}``. The capability flags only come with the single get."""

    server_number: int
    server_name: str = ""
    server_ip: str | None = None
    server_ipv6_net: str | None = None
    product: str = ""
    dc: str = ""
    traffic: str | None = None
    status: ServerStatus = ServerStatus.UNKNOWN
    cancelled: bool = False
    paid_until: dt.date | None = None
    ip: NullableList[str] = Field(default_factory=list)
    subnet: NullableList[Subnet] = Field(default_factory=list)
    reset: bool | None = None
    rescue: bool | None = None
    vnc: bool | None = None
    windows: bool | None = None
    plesk: bool | None = None
    cpanel: bool | None = None
    wol: bool | None = None
    hot_swap: bool | None = None
    linked_storagebox: int | None = None

    @field_validator("status", mode="before")
    @classmethod
    def _known_status(cls, value: Any) -> Any:
        return _enum_or_unknown(ServerStatus, value)

    @field_validator("paid_until", mode="before")
    @classmethod
    def _empty_date(cls, value: Any) -> Any:
        return value or None


class Reset(_Model):
    """``GET /reset/{n}``: the reset types this server offers (they differ per server)."""

    server_number: int
    server_ip: str | None = None
    server_ipv6_net: str | None = None
    types: NullableList[str] = Field(default_factory=list, alias="type")
    operating_status: str | None = None

    def supports(self, kind: ResetType) -> bool:
        return kind.value in self.types


class ResetResult(_Model):
    """``POST /reset/{n}``: the reset that was triggered."""

    server_number: int
    server_ip: str | None = None
    server_ipv6_net: str | None = None
    type: str


class KeyInfo(_Model):
    """A key as it appears inside rescue/transaction lists: always a fingerprint, sometimes more."""

    fingerprint: str
    type: str | None = None
    size: int | None = None
    name: str | None = None
    data: str | None = None


class WrappedKey(_Model):
    """``{"key": {...}}``, the element type of ``authorized_key`` and ``host_key`` lists."""

    key: KeyInfo


def _fingerprints(keys: list[WrappedKey]) -> list[str]:
    return [wrapped.key.fingerprint for wrapped in keys]


class Rescue(_Model):
    """``GET/POST/DELETE /boot/{n}/rescue``. ``active`` applies to the next boot only.

    ``os`` is a list of available systems while inactive and the chosen one while active (samples).
    """

    server_number: int
    server_ip: str | None = None
    server_ipv6_net: str | None = None
    os: list[str] | str
    active: bool
    password: SecretStr | None = None
    authorized_key: NullableList[WrappedKey] = Field(default_factory=list)
    host_key: NullableList[WrappedKey] = Field(default_factory=list)
    keyboard: str | None = None

    @property
    def authorized_fingerprints(self) -> list[str]:
        return _fingerprints(self.authorized_key)

    @property
    def host_key_fingerprints(self) -> list[str]:
        return _fingerprints(self.host_key)


class Key(_Model):
    """``GET/POST /key``: an SSH public key stored in Robot, addressed by its MD5 fingerprint."""

    name: str
    fingerprint: str
    type: str | None = None
    size: int | None = None
    data: str | None = None
    created_at: str | None = None


class Money(_Model):
    net: Decimal
    gross: Decimal | None = None
    hourly_net: Decimal | None = None
    hourly_gross: Decimal | None = None


class LocationPrice(_Model):
    location: str | None = None
    price: Money
    price_setup: Money


class ProductAddon(_Model):
    id: str
    name: str | None = None
    min: int | None = None
    max: int | None = None
    prices: NullableList[LocationPrice] = Field(default_factory=list)


class Product(_Model):
    """``GET /order/server/product``: an orderable standard server, priced per location (EUR, ex VAT)."""

    id: str
    name: str = ""
    description: NullableList[str] = Field(default_factory=list)
    traffic: str | None = None
    dist: NullableList[str] = Field(default_factory=list)
    lang: NullableList[str] = Field(default_factory=list)
    location: NullableList[str] = Field(default_factory=list)
    prices: NullableList[LocationPrice] = Field(default_factory=list)
    orderable_addons: NullableList[ProductAddon] = Field(default_factory=list)

    def price_at(self, location: str) -> LocationPrice | None:
        for price in self.prices:
            if price.location is not None and price.location.upper() == location.upper():
                return price
        return None


class TransactionProduct(_Model):
    id: str | int
    name: str = ""
    description: NullableList[str] = Field(default_factory=list)
    traffic: str | None = None
    dist: str | None = None
    lang: str | None = None
    location: str | None = None


class Transaction(_Model):
    """``POST/GET /order/server/transaction``. ``server_number`` stays None until the order is ready."""

    id: str
    date: str
    status: TransactionStatus
    server_number: int | None = None
    server_ip: str | None = None
    authorized_key: NullableList[WrappedKey] = Field(default_factory=list)
    host_key: NullableList[WrappedKey] = Field(default_factory=list)
    comment: str | None = None
    product: TransactionProduct
    addons: NullableList[str] = Field(default_factory=list)

    @field_validator("status", mode="before")
    @classmethod
    def _known_status(cls, value: Any) -> Any:
        return _enum_or_unknown(TransactionStatus, value)


class Cancellation(_Model):
    """``GET/POST /server/{n}/cancellation``. ``cancellation_reason`` lists choices until one is chosen."""

    server_number: int
    server_ip: str | None = None
    server_ipv6_net: str | None = None
    server_name: str | None = None
    earliest_cancellation_date: str | None = None
    cancelled: bool
    reservation_possible: bool = False
    reserved: bool = False
    cancellation_date: str | None = None
    cancellation_reason: list[str] | str | None = None


class VSwitchServerStatus(StrEnum):
    """A server's membership of a vSwitch. Joining and leaving both pass through ``processing``."""

    READY = "ready"
    PROCESSING = "processing"  # the doc says "in process"; the API sends "processing" (both map here)
    FAILED = "failed"
    UNKNOWN = "unknown"


def _membership_status(value: Any) -> Any:
    return VSwitchServerStatus.PROCESSING.value if value == "in process" else value


class VSwitchServer(_Model):
    """A server on a vSwitch, as ``GET /vswitch/{id}`` lists it."""

    server_number: int | None = None
    server_ip: str | None = None
    server_ipv6_net: str | None = None
    status: VSwitchServerStatus = VSwitchServerStatus.UNKNOWN

    @field_validator("status", mode="before")
    @classmethod
    def _known_status(cls, value: Any) -> Any:
        return _enum_or_unknown(VSwitchServerStatus, _membership_status(value))


class VSwitchSubnet(_Model):
    ip: str
    mask: int | str
    gateway: str | None = None


class VSwitchCloudNetwork(_Model):
    id: int
    ip: str
    mask: int | str
    gateway: str | None = None


class VSwitch(_Model):
    """``GET /vswitch[/{id}]`` and ``POST /vswitch``. Not wrapped in an object name (the documented
    deviation). The list carries only ``id, name, vlan, cancelled``: members need the single get."""

    id: int
    name: str
    vlan: int
    cancelled: bool = False
    server: NullableList[VSwitchServer] = Field(default_factory=list)
    subnet: NullableList[VSwitchSubnet] = Field(default_factory=list)
    cloud_network: NullableList[VSwitchCloudNetwork] = Field(default_factory=list)

    def member(self, server_number: int) -> VSwitchServer | None:
        """This server's entry, whatever its status; None when it is not on the vSwitch."""
        return next((s for s in self.server if s.server_number == server_number), None)

    @property
    def busy(self) -> bool:
        """A member is joining or leaving: Robot refuses every change with 409 VSWITCH_IN_PROCESS."""
        return any(s.status is VSwitchServerStatus.PROCESSING for s in self.server)


class OrderRequest(_Model):
    """What ``POST /order/server/transaction`` needs. Keys by fingerprint; a password only if you must."""

    product_id: str
    location: str
    authorized_keys: NullableList[str] = Field(default_factory=list)
    password: SecretStr | None = None
    dist: str | None = None
    lang: str | None = None
    addons: NullableList[str] = Field(default_factory=list)
    comment: str | None = None

    def form(self, *, test: bool) -> dict[str, str | list[str]]:
        if bool(self.authorized_keys) == (self.password is not None):
            raise ValueError("an order needs exactly one of authorized_keys or password")
        data: dict[str, str | list[str]] = {"product_id": self.product_id, "location": self.location}
        if self.authorized_keys:
            data["authorized_key[]"] = list(self.authorized_keys)
        if self.password is not None:
            data["password"] = self.password.get_secret_value()
        optional = {"dist": self.dist, "lang": self.lang, "comment": self.comment}
        data.update({k: v for k, v in optional.items() if v is not None})
        if self.addons:
            data["addon[]"] = list(self.addons)
        if test:
            data["test"] = "true"
        return data
