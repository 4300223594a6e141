"""capi_gpu.pricing: the seed's €1.22/€7.41 from €889, the Oct 2026 GEX131 prices, setup amortisation,
Hetzner's hourly-billing cap and re-order fees, cloud conversion, break-even and per-slice figures, bad input."""

from __future__ import annotations

import pytest

from capi_gpu import pricing

OCT = pricing.GEX131_OCT_2026
NO_CLOUD: tuple[pricing.CloudOffer, ...] = ()


def price(monthly: float, setup: float = 0.0, hourly: float | None = None) -> pricing.HostPrice:
    return pricing.HostPrice("test", monthly, setup, hourly, "today", "test")


@pytest.mark.parametrize(
    ("monthly", "used_hours", "per_used_hour"),
    [
        (889.0, 730, 1.22),  # the seed: Dec 2025 price, every hour of the month
        (889.0, 120, 7.41),  # the seed: 4 h a day
        (1197.30, 730, 1.64),  # hetzner.md §5, Jun 2026
        (1197.30, 120, 9.98),
        (1497.30, 730, 2.05),  # hetzner.md §5, Oct 2026
        (1497.30, 120, 12.48),
    ],
)
def test_per_used_gpu_hour_matches_the_reference_table(monthly: float, used_hours: float, per_used_hour: float) -> None:
    terms = pricing.Terms(term_months=1)
    s = pricing.scenario(
        price(monthly), terms, pricing.utilization_from_hours(used_hours, terms), NO_CLOUD, pricing.DEFAULT_FX
    )
    assert s.leased_per_used_gpu_hour is not None
    assert round(s.leased_per_used_gpu_hour, 2) == per_used_hour


def test_seed_check_reproduces_the_post() -> None:
    seed = pricing.seed_check()
    assert (seed.monthly, round(seed.per_hour_730, 2), round(seed.per_used_hour_120, 2)) == (889.0, 1.22, 7.41)


def test_october_2026_list_price_is_the_default_and_hourly_is_monthly_over_624() -> None:
    assert (OCT.monthly, OCT.hourly, OCT.setup, OCT.as_of) == (1497.30, 2.3995, 1499.0, "2026-10-08")
    assert round(OCT.monthly / pricing.HETZNER_HOURLY_DIVISOR, 4) == OCT.hourly
    assert round(price(889.0).hourly_rate, 4) == 1.4247  # no hourly given: Hetzner's /624 rule


@pytest.mark.parametrize(
    ("term_months", "month"),
    [(1, 1497.30 + 1499), (12, 1497.30 + 1499 / 12), (36, 1497.30 + 1499 / 36)],
)
def test_setup_fee_is_spread_over_the_term(term_months: float, month: float) -> None:
    assert pricing.leased_month(OCT, pricing.Terms(term_months=term_months)) == pytest.approx(month)


def test_default_prices_at_16_50_100_percent() -> None:
    terms = pricing.Terms()  # 12-month term, 730 h
    got = [pricing.scenario(OCT, terms, u, NO_CLOUD, pricing.DEFAULT_FX) for u in (0.16, 0.5, 1.0)]
    assert [round(s.leased_per_used_gpu_hour or 0, 2) for s in got] == [13.89, 4.44, 2.22]
    assert [round(s.leased_per_used_slice_hour or 0, 2) for s in got] == [3.47, 1.11, 0.56]
    assert all(s.leased_month == pytest.approx(1622.2167, abs=1e-3) for s in got)


@pytest.mark.parametrize(
    ("used_hours", "orders", "month"),
    [
        (0, 1, 0.0),  # nothing used: nothing ordered
        (10, 1, 10 * 2.3995 + 1499),
        (10.2, 1, 11 * 2.3995 + 1499),  # every started hour counts
        (624, 1, 624 * 2.3995 + 1499),  # 624 h at the rounded list rate: just under the monthly price ...
        (625, 1, 1497.30 + 1499),  # ... one more and the monthly price is the cap
        (730, 1, 1497.30 + 1499),
        (100, 3, 100 * 2.3995 + 3 * 1499),  # each re-order pays the setup again
        (100, 0, 100 * 2.3995),
    ],
)
def test_hourly_billing_rounds_up_caps_at_monthly_and_pays_setup_per_order(
    used_hours: float, orders: int, month: float
) -> None:
    assert pricing.hourly_billed_month(OCT, used_hours, pricing.Terms(orders_per_month=orders)) == pytest.approx(month)


def test_hourly_billing_beats_leasing_only_below_a_few_dozen_hours() -> None:
    terms = pricing.Terms()
    below = pricing.hourly_wins_below_hours(OCT, terms)
    assert below == pytest.approx((1497.30 + 1499 / 12 - 1499) / 2.3995)
    assert round(below, 1) == 51.4
    assert pricing.hourly_billed_month(OCT, below - 1, terms) < pricing.leased_month(OCT, terms)
    assert pricing.hourly_billed_month(OCT, below + 1, terms) > pricing.leased_month(OCT, terms)
    # Two re-orders a month cost more than the whole kept month: never worth it.
    assert pricing.hourly_wins_below_hours(OCT, pricing.Terms(orders_per_month=2)) == 0.0
    # Without setup fee hourly billing wins up to the cap (624 h).
    assert pricing.hourly_wins_below_hours(price(889.0), pricing.Terms(term_months=1)) == pytest.approx(624)


@pytest.mark.parametrize(
    ("offer", "eur_per_gpu_hour", "break_even"),
    [
        (pricing.SCALEWAY_H100, 2.87, 1622.2167 / (730 * 2.87)),
        (pricing.CLOUD_RUN_L4, 1.05 / 1.1669 * 4, 1622.2167 / (730 * 1.05 / 1.1669 * 4)),
    ],
)
def test_cloud_offers_convert_currency_and_break_even(
    offer: pricing.CloudOffer, eur_per_gpu_hour: float, break_even: float
) -> None:
    terms = pricing.Terms()
    assert pricing.cloud_eur_per_gpu_hour(offer, pricing.DEFAULT_FX) == pytest.approx(eur_per_gpu_hour)
    u = pricing.break_even_utilization(OCT, terms, offer, pricing.DEFAULT_FX)
    assert u == pytest.approx(break_even)
    at = pricing.scenario(OCT, terms, u, [offer], pricing.DEFAULT_FX)
    assert at.cloud[0].month == pytest.approx(at.leased_month)  # the definition of break-even
    above = pricing.scenario(OCT, terms, min(u + 0.05, 1.0), [offer], pricing.DEFAULT_FX)
    assert above.cloud[0].month > above.leased_month


def test_default_break_evens() -> None:
    terms = pricing.Terms()
    got = [round(pricing.break_even_utilization(OCT, terms, o, pricing.DEFAULT_FX), 3) for o in pricing.DEFAULT_OFFERS]
    assert got == [0.774, 0.617]


def test_a_slice_hour_is_a_quarter_gpu_hour_when_packed() -> None:
    s = pricing.scenario(OCT, pricing.Terms(), 1.0, [pricing.CLOUD_RUN_L4], pricing.DEFAULT_FX)
    assert s.leased_per_used_slice_hour == pytest.approx((s.leased_per_used_gpu_hour or 0) / 4)
    # One L4 stands in for one 1g.24gb slice: its slice-hour is its own hourly price.
    assert s.cloud[0].per_used_slice_hour == pytest.approx(1.05 / 1.1669)


def test_zero_utilization_has_no_per_hour_figure() -> None:
    s = pricing.scenario(OCT, pricing.Terms(), 0.0, NO_CLOUD, pricing.DEFAULT_FX)
    assert (s.leased_per_used_gpu_hour, s.hourly_per_used_gpu_hour, s.hourly_month) == (None, None, 0.0)
    assert s.leased_month > 0  # a kept server costs money unused


@pytest.mark.parametrize(
    "bad",
    [
        lambda: pricing.check_utilization(1.2),
        lambda: pricing.check_utilization(-0.1),
        lambda: pricing.check_utilization(float("nan")),
        lambda: pricing.utilization_from_hours(731, pricing.Terms()),
        lambda: pricing.Terms(term_months=0),
        lambda: pricing.Terms(orders_per_month=-1),
        lambda: pricing.check_price(price(-1.0)),
        lambda: pricing.cloud_eur_per_gpu_hour(
            pricing.CloudOffer("x", 1.0, pricing.Currency.EUR, 0.0, "", "", ""), pricing.DEFAULT_FX
        ),
    ],
)
def test_bad_input_is_a_cost_error(bad: object) -> None:
    assert callable(bad)
    with pytest.raises(pricing.CostError):
        bad()


def test_caveat_names_the_catch() -> None:
    for phrase in ("cancelled", "new order", "setup fee", "10-12 workday", "20 orders a day"):
        assert phrase in pricing.HOURLY_CAVEAT
