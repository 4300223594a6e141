"""What a *used* GPU-hour of a leased GEX131 costs, against Hetzner hourly billing and cloud GPUs.

A dedicated GPU server is bought by the month, so its price per useful hour depends entirely on how
much of the month the GPU (or its MIG slices) is actually held by work. Capacity plans and the
"buy more hosts or burst to cloud" decision need that figure, with the price basis and its date in
view, because Hetzner's GEX131 price went from €889 (Dec 2025) to €1,497.30 plus €1,499 setup
(Oct 2026). The model, kept small enough to check by hand (``docs/cost.md``):

* **leased**: one month costs ``monthly + setup / term``; divided by the used hours
  (``utilization * hours_per_month``, 730 h as in the seed's figures) it is € per used GPU-hour;
* **Hetzner hourly billing**: ``ceil(hours) * hourly`` capped at the monthly price, but a server only
  stops billing when it is cancelled, so holding it "only while used" costs a new order, a new setup
  fee and a 10-12 workday delivery each time (:data:`HOURLY_CAVEAT`);
* **cloud**: billed per minute or second, so a used hour costs the list price; an offer stands in for
  a fraction of one GEX131 GPU (an L4 24 GB is one ``1g.24gb`` slice, an H100 a whole GPU).

Utilization is a fraction of the GPU's memory slices held over time, so a fully packed GPU's
slice-hour is a quarter of its GPU-hour. The measured utilization (from ResourceClaims) is in
``capi_gpu.usage``. Pure: no I/O; the CLI (``capi_gpu.cli.cost``) reads flags and prints.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

HOURS_PER_MONTH = 730.0  # 8,760 h / 12: the basis of the seed's €1.22/h
HETZNER_HOURLY_DIVISOR = 624  # every GEX hourly price is the monthly price / 624 (hetzner.md §4.1)
SLICES_PER_GPU = 4  # RTX PRO 6000 memory slices (capi_gpu.gpu.catalog_data)
DEFAULT_TERM_MONTHS = 12.0


class CostError(ValueError):
    """An input the model cannot price (negative price, utilization above 1, zero term)."""


class Currency(StrEnum):
    EUR = "EUR"
    USD = "USD"


@dataclass(frozen=True, slots=True)
class HostPrice:
    """A Hetzner list price, net EUR; ``hourly`` None means Hetzner's rule, monthly / 624."""

    label: str
    monthly: float
    setup: float
    hourly: float | None
    as_of: str
    source: str

    @property
    def hourly_rate(self) -> float:
        return self.hourly if self.hourly is not None else self.monthly / HETZNER_HOURLY_DIVISOR


GEX131_OCT_2026 = HostPrice(
    "GEX131", 1497.30, 1499.0, 2.3995, "2026-10-08", "Hetzner live price feed ROBOT_1747 (hetzner.md §4.1)"
)
GEX131_DEC_2025 = HostPrice("GEX131 at launch", 889.0, 0.0, 1.4247, "2025-12-11", "Hetzner press release (seed)")


@dataclass(frozen=True, slots=True)
class FxRate:
    """USD per EUR, dated: cloud offers priced in dollars are converted with it."""

    usd_per_eur: float
    as_of: str
    source: str

    def to_eur(self, amount: float, currency: Currency) -> float:
        if currency is Currency.EUR:
            return amount
        if currency is Currency.USD:
            return amount / self.usd_per_eur
        typing.assert_never(currency)


# Hetzner's own dollar and euro prices for the GEX131 of 15 Jun 2026 (USD 1,397.10 = EUR 1,197.30): a
# rate published next to the prices it converts, not a market quote. Override with --usd-per-eur.
DEFAULT_FX = FxRate(1.1669, "2026-06-15", "Hetzner GEX131 USD/EUR price pair (1,397.10 / 1,197.30)")


@dataclass(frozen=True, slots=True)
class CloudOffer:
    """A per-use cloud GPU and the share of one GEX131 GPU it stands in for."""

    name: str
    hourly: float
    currency: Currency
    gpu_fraction: float
    billing: str
    as_of: str
    source: str


SCALEWAY_H100 = CloudOffer(
    "Scaleway H100-1-80G", 2.87, Currency.EUR, 1.0, "per minute", "2026-09", "Scaleway API hourly_price 2.8665"
)
CLOUD_RUN_L4 = CloudOffer(
    "Cloud Run L4 (4 vCPU, 16 GiB)",
    1.05,
    Currency.USD,
    1 / SLICES_PER_GPU,
    "per second",
    "2026-08",
    "Cloud Billing SKUs us-central1, no zonal redundancy",
)
DEFAULT_OFFERS = (SCALEWAY_H100, CLOUD_RUN_L4)

HOURLY_CAVEAT = (
    "Hetzner hourly billing stops only when the server is cancelled: using it again is a new order, "
    "a new setup fee, a 10-12 workday delivery for a GEX131, and at most 20 orders a day. "
    "For a GEX, keep it all month or cancel it for good."
)


@dataclass(frozen=True, slots=True)
class Terms:
    """How the setup fee is spread and how the hourly-billing alternative is run."""

    term_months: float = DEFAULT_TERM_MONTHS
    hours_per_month: float = HOURS_PER_MONTH
    orders_per_month: int = 1  # hourly billing: how often the server is cancelled and re-ordered
    slices_per_gpu: int = SLICES_PER_GPU

    def __post_init__(self) -> None:
        if self.term_months <= 0:
            raise CostError("the term must be longer than zero months")
        if self.hours_per_month <= 0:
            raise CostError("hours per month must be positive")
        if self.orders_per_month < 0 or self.slices_per_gpu < 1:
            raise CostError("orders per month must be >= 0 and slices per GPU >= 1")


@dataclass(frozen=True, slots=True)
class CloudCost:
    offer: CloudOffer
    per_used_gpu_hour: float  # EUR, for a whole GEX131-GPU's worth of offers
    per_used_slice_hour: float  # EUR
    month: float  # EUR, for this scenario's used hours
    break_even_utilization: float  # leased is cheaper above this (may exceed 1: never)


@dataclass(frozen=True, slots=True)
class Scenario:
    """One utilization priced three ways; ``None`` per-hour figures mean nothing was used."""

    utilization: float
    used_hours: float
    leased_month: float
    leased_per_used_gpu_hour: float | None
    leased_per_used_slice_hour: float | None
    hourly_month: float
    hourly_per_used_gpu_hour: float | None
    cloud: tuple[CloudCost, ...]


def check_price(price: HostPrice) -> None:
    if min(price.monthly, price.setup, price.hourly_rate) < 0:
        raise CostError("prices cannot be negative")


def check_utilization(utilization: float) -> float:
    if not 0.0 <= utilization <= 1.0 or math.isnan(utilization):
        raise CostError(f"utilization must be between 0 and 1, got {utilization}")
    return utilization


def utilization_from_hours(used_hours: float, terms: Terms) -> float:
    if used_hours < 0 or used_hours > terms.hours_per_month:
        raise CostError(f"used hours must be between 0 and {terms.hours_per_month:g} a month, got {used_hours:g}")
    return used_hours / terms.hours_per_month


def leased_month(price: HostPrice, terms: Terms) -> float:
    """One month of a kept server: the monthly price plus the setup fee spread over the term."""
    return price.monthly + price.setup / terms.term_months


def hourly_billed_month(price: HostPrice, used_hours: float, terms: Terms) -> float:
    """A server ordered for the used hours and cancelled after: started hours, capped, plus setup fees."""
    if used_hours <= 0:
        return 0.0
    hours = min(math.ceil(used_hours - 1e-9), math.ceil(terms.hours_per_month))
    return min(hours * price.hourly_rate, price.monthly) + terms.orders_per_month * price.setup


def hourly_wins_below_hours(price: HostPrice, terms: Terms) -> float:
    """Used hours a month below which cancelling and re-ordering beats keeping the server (0: never)."""
    saved = leased_month(price, terms) - terms.orders_per_month * price.setup
    if saved <= 0 or price.hourly_rate <= 0:
        return 0.0
    return min(saved / price.hourly_rate, terms.hours_per_month)


def cloud_eur_per_gpu_hour(offer: CloudOffer, fx: FxRate) -> float:
    """EUR for as many offers as replace one GEX131 GPU, for one hour."""
    if offer.gpu_fraction <= 0 or offer.hourly < 0:
        raise CostError(f"{offer.name}: the GPU fraction must be positive and the price not negative")
    return fx.to_eur(offer.hourly, offer.currency) / offer.gpu_fraction


def break_even_utilization(price: HostPrice, terms: Terms, offer: CloudOffer, fx: FxRate) -> float:
    """The utilization at which the leased host and the cloud offer cost the same per month."""
    return leased_month(price, terms) / (terms.hours_per_month * cloud_eur_per_gpu_hour(offer, fx))


def _per(total: float, hours: float) -> float | None:
    return total / hours if hours > 0 else None


def scenario(price: HostPrice, terms: Terms, utilization: float, offers: Sequence[CloudOffer], fx: FxRate) -> Scenario:
    check_price(price)
    used = check_utilization(utilization) * terms.hours_per_month
    lease = leased_month(price, terms)
    hourly = hourly_billed_month(price, used, terms)
    per_gpu = _per(lease, used)
    cloud = []
    for offer in offers:
        rate = cloud_eur_per_gpu_hour(offer, fx)
        cloud.append(
            CloudCost(
                offer=offer,
                per_used_gpu_hour=rate,
                per_used_slice_hour=rate / terms.slices_per_gpu,
                month=rate * used,
                break_even_utilization=break_even_utilization(price, terms, offer, fx),
            )
        )
    return Scenario(
        utilization=utilization,
        used_hours=used,
        leased_month=lease,
        leased_per_used_gpu_hour=per_gpu,
        leased_per_used_slice_hour=None if per_gpu is None else per_gpu / terms.slices_per_gpu,
        hourly_month=hourly,
        hourly_per_used_gpu_hour=_per(hourly, used),
        cloud=tuple(cloud),
    )


@dataclass(frozen=True, slots=True)
class SeedCheck:
    """The seed post's arithmetic: €889 a month is €1.22 per hour over 730 h and €7.41 over 120 h."""

    monthly: float
    per_hour_730: float
    per_used_hour_120: float


def seed_check(price: HostPrice = GEX131_DEC_2025) -> SeedCheck:
    terms = Terms(term_months=1.0)
    no_setup = HostPrice(price.label, price.monthly, 0.0, price.hourly, price.as_of, price.source)
    full = scenario(no_setup, terms, 1.0, (), DEFAULT_FX).leased_per_used_gpu_hour
    part = scenario(no_setup, terms, utilization_from_hours(120, terms), (), DEFAULT_FX).leased_per_used_gpu_hour
    assert full is not None and part is not None  # both scenarios use hours
    return SeedCheck(price.monthly, full, part)
