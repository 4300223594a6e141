"""`capi-gpu cost --plot FILE`: the cost report's answer as the curve it is.

The text report prints € per used GPU-hour at a few utilizations; the decision ("keep the host or burst
to cloud?") is where the curves cross, so the chart draws, against utilization: the leased GEX131, the
same host shared by MIG slices (per slice-hour), Hetzner hourly billing, each cloud offer, the
break-even points, and with ``--measured`` the fleet's measured utilization. The seed's launch-price
figures (€1.22 and €7.41 per used hour at 730 h and 120 h, €1.42 an hour billed hourly) are drawn and
labelled, so the chart can be checked against the post that started the project.

Every number comes from ``capi_gpu.pricing`` (the same functions as the text report). matplotlib is an
optional extra (``capi-gpu[plot]``): the operator image does not carry a plotting stack, so it is
imported here, on use, and its absence is a usage error that names the extra. Figures are built with
``matplotlib.figure.Figure`` (no pyplot, no global backend state).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from capi_gpu import pricing

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = ("svg", "png")
U_MIN = 0.05  # below 5 % every whole-host curve leaves the chart (€44+ per used hour)
POINTS = 200
_OFFER_COLORS = ("tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed (the ``plot`` extra)."""


def grid(points: int = POINTS) -> list[float]:
    return [U_MIN + (1.0 - U_MIN) * i / (points - 1) for i in range(points)]


def leased_curve(
    price: pricing.HostPrice, terms: pricing.Terms, us: Sequence[float], per_slice: bool = False
) -> list[float]:
    month = pricing.leased_month(price, terms)
    div = terms.slices_per_gpu if per_slice else 1
    return [month / (u * terms.hours_per_month) / div for u in us]


def hourly_curve(price: pricing.HostPrice, terms: pricing.Terms, us: Sequence[float]) -> list[float]:
    return [
        pricing.hourly_billed_month(price, u * terms.hours_per_month, terms) / (u * terms.hours_per_month) for u in us
    ]


def _eur(value: float) -> str:
    return f"€{value:,.2f}"


def figure(
    price: pricing.HostPrice,
    terms: pricing.Terms,
    fx: pricing.FxRate,
    offers: Sequence[pricing.CloudOffer],
    scenarios: Sequence[pricing.Scenario],
    measured: float | None = None,
) -> Figure:
    """The chart; each line carries a label the test (and a reader) can find it by."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - the dev extra always has it
        raise PlotUnavailable("--plot needs matplotlib: pip install 'capi-gpu[plot]'") from exc
    fig = Figure(figsize=(11, 6.8), layout="constrained")
    ax = fig.subplots()
    us = grid()
    pct = [u * 100 for u in us]
    lease = pricing.leased_month(price, terms)
    ax.plot(
        pct,
        leased_curve(price, terms, us),
        color="tab:blue",
        lw=2.4,
        label=f"leased {price.label} (€{price.monthly:,.2f}/month + setup/{terms.term_months:g}), per used GPU-hour",
    )
    ax.plot(
        pct,
        leased_curve(price, terms, us, per_slice=True),
        color="tab:blue",
        lw=1.6,
        ls="--",
        label=f"same host shared by {terms.slices_per_gpu} MIG slices, per used slice-hour",
    )
    ax.plot(
        pct,
        hourly_curve(price, terms, us),
        color="tab:orange",
        lw=1.8,
        label=f"Hetzner hourly billing (€{price.hourly_rate:.4f}/h, {terms.orders_per_month} order/month)",
    )
    for color, offer in zip(_OFFER_COLORS, offers, strict=False):
        rate = pricing.cloud_eur_per_gpu_hour(offer, fx)
        share = "1 GPU" if offer.gpu_fraction == 1 else f"x{1 / offer.gpu_fraction:g} per GPU"
        ax.axhline(rate, color=color, lw=1.6, label=f"{offer.name} ({share}): {_eur(rate)} per used GPU-hour")
        _break_even(ax, pricing.break_even_utilization(price, terms, offer, fx), rate, color)
    wins_below = pricing.hourly_wins_below_hours(price, terms)
    if wins_below > 0:
        u = wins_below / terms.hours_per_month
        ax.plot([u * 100], [lease / wins_below], "o", color="tab:orange", ms=7)
        ax.annotate(
            f"hourly billing cheaper below {wins_below:.1f} h ({u:.1%})",
            (u * 100, lease / wins_below),
            textcoords="offset points",
            xytext=(8, 10),
            fontsize=8,
            color="tab:orange",
        )
    for s in scenarios:
        if s.leased_per_used_gpu_hour is not None:
            ax.plot([s.utilization * 100], [s.leased_per_used_gpu_hour], "s", color="tab:blue", ms=6)
            ax.annotate(
                f"{s.utilization:.0%}: {_eur(s.leased_per_used_gpu_hour)}",
                (s.utilization * 100, s.leased_per_used_gpu_hour),
                textcoords="offset points",
                xytext=(-70, -16) if s.utilization > 0.9 else (6, 6),
                fontsize=8,
                color="tab:blue",
            )
    _seed(ax, terms)
    if measured is not None:
        ax.axvline(measured * 100, color="black", lw=1.4, ls=":", label=f"measured utilization {measured:.1%}")
    ax.set_yscale("log")
    ax.set_xlim(0, 100)
    ax.set_ylim(0.25, 60)
    ticks = (0.25, 0.5, 1, 2, 3, 5, 10, 20, 50)
    ax.set_yticks(ticks, [f"€{t:g}" for t in ticks])
    ax.set_yticks([], minor=True)
    ax.set_xlabel("utilization: share of the month the GPU's slices are held by work (%)")
    ax.set_ylabel("€ per used hour (net of VAT, log scale)")
    ax.set_title(
        f"What a used GPU-hour costs: {price.label} prices of {price.as_of}, "
        f"USD at {fx.usd_per_eur:g}/EUR ({fx.as_of})",
        fontsize=11,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    return fig


def _break_even(ax: Axes, u: float, rate: float, color: str) -> None:
    if 0 < u <= 1:
        ax.plot([u * 100], [rate], "o", color=color, ms=8, mec="black")
        ax.annotate(
            f"break-even {u:.1%}",
            (u * 100, rate),
            textcoords="offset points",
            xytext=(-20, -16),
            fontsize=8,
            color=color,
        )


def _seed(ax: Axes, terms: pricing.Terms) -> None:
    """The launch price (€889, no setup) the seed post priced, with its three figures written out."""
    seed = pricing.seed_check()
    launch = pricing.GEX131_DEC_2025
    seed_terms = pricing.Terms(1.0, terms.hours_per_month, terms.orders_per_month, terms.slices_per_gpu)
    us = grid()
    ax.plot(
        [u * 100 for u in us],
        leased_curve(launch, seed_terms, us),
        color="grey",
        lw=1.2,
        ls="-.",
        label=f"seed: {launch.label} €{launch.monthly:g}/month ({launch.as_of}), per used GPU-hour",
    )
    at_120 = 120 / terms.hours_per_month
    for u, value, text in ((1.0, seed.per_hour_730, "730 h"), (at_120, seed.per_used_hour_120, "120 h")):
        ax.plot([u * 100], [value], "D", color="grey", ms=6)
        ax.annotate(
            f"seed {_eur(value)} at {text}",
            (u * 100, value),
            textcoords="offset points",
            xytext=(-125 if u == 1.0 else 8, -4 if u == 1.0 else 4),
            fontsize=9,
            color="dimgrey",
        )
    ax.axhline(launch.hourly_rate, color="grey", lw=0.9, ls=":")
    ax.annotate(
        f"seed hourly billing {_eur(launch.hourly_rate)}/h",
        (2, launch.hourly_rate),
        textcoords="offset points",
        xytext=(0, 3),
        fontsize=9,
        color="dimgrey",
    )


def check_path(path: Path) -> str:
    """The format the file name asks for; checked before any work is done."""
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(f"--plot {path}: the file name must end in .svg or .png")
    return fmt


def save(fig: Figure, path: Path) -> None:
    fmt = check_path(path)
    import matplotlib

    # SVG text stays text (not glyph paths), so the labelled figures can be searched and read back.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "capi-gpu"}):
        fig.savefig(path, format=fmt, dpi=110, metadata={"Date": None} if fmt == "svg" else None)
