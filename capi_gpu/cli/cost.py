"""`capi-gpu cost`: € per used GPU-hour of a leased GEX131, against hourly billing and cloud GPUs.

The arithmetic is in ``capi_gpu.pricing`` (prices, amortisation, break-even) and ``capi_gpu.usage``
(slices held by claims); this module is the edge. It turns flags into prices, reads the cluster for
``--measured`` (ResourceSlices of ``gpu.nvidia.com`` for the nodes, ResourceClaims for what is held)
and prints; ``--plot`` also draws the curves (``cost_plot``). Defaults are the dated list prices from
the research notes, printed with their date so a stale default is visible; every one is a flag.
Exit codes: 0 printed, 1 nothing to measure, 2 a bad flag, 3 the apiserver failed.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capi_gpu import domain, kube, pricing, usage
from capi_gpu.cli import EXIT_OK, EXIT_USAGE, cost_plot, kubeargs
from capi_gpu.cli.kubeargs import CliFailure
from capi_gpu.gpu import catalog, gpuplan

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DEFAULT_UTILIZATIONS = (0.16, 0.5, 1.0)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cost", help="€ per used GPU-hour: leased GEX131 vs Hetzner hourly billing vs cloud")
    d = pricing.GEX131_OCT_2026
    p.add_argument("--monthly", type=float, help=f"monthly price, EUR net (default {d.monthly:.2f}, {d.as_of})")
    p.add_argument("--setup", type=float, help=f"setup fee per order, EUR net (default {d.setup:.2f})")
    p.add_argument("--hourly", type=float, help=f"hourly price (default {d.hourly}; with --monthly: monthly/624)")
    p.add_argument("--price-date", help="date of the price given (printed next to it)")
    p.add_argument(
        "--term-months", type=float, default=pricing.DEFAULT_TERM_MONTHS, help="months the setup is spread over"
    )
    p.add_argument("--hours-per-month", type=float, default=pricing.HOURS_PER_MONTH, help="hours in a month (730)")
    p.add_argument("--orders-per-month", type=int, default=1, help="hourly billing: cancel+re-order cycles a month")
    src = p.add_argument_group("utilization (default: 16%%, 50%% and 100%%)")
    src.add_argument("--utilization", type=float, action="append", default=[], metavar="F", help="0..1 (repeatable)")
    src.add_argument(
        "--used-hours", type=float, action="append", default=[], metavar="H", help="per month (repeatable)"
    )
    src.add_argument("--measured", action="store_true", help="measure from ResourceClaims over --window")
    p.add_argument(
        "--standby-hosts",
        type=int,
        default=None,
        help="hosts kept on standby (idle, prepared); with --measured: counted from HetznerGPUHosts",
    )
    p.add_argument("--window", default="24h", help="measurement window, e.g. 24h, 7d (with --measured)")
    p.add_argument("--node", action="append", default=[], help="measure only these GPU nodes (repeatable)")
    p.add_argument("--gpu", default=gpuplan.DEFAULT_MODEL, help="catalog model whose MIG slices are counted")
    p.add_argument(
        "--cloud",
        action="append",
        default=[],
        metavar="NAME,PRICE,CURRENCY,GPU_FRACTION",
        help="cloud offer per hour; GPU_FRACTION = share of one GEX131 GPU it replaces (repeatable; replaces defaults)",
    )
    p.add_argument("--usd-per-eur", type=float, default=pricing.DEFAULT_FX.usd_per_eur, help="exchange rate")
    p.add_argument("--fx-date", help=f"date of --usd-per-eur (default rate's: {pricing.DEFAULT_FX.as_of})")
    kubeargs.add_output_arg(p)
    p.add_argument(
        "--plot", type=Path, metavar="FILE", help="also draw the curves to FILE (.svg or .png; extra 'plot')"
    )
    p.add_argument("--kubeconfig", help="kubeconfig for --measured (default: $KUBECONFIG, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context for --measured")
    p.set_defaults(func=kubeargs.guarded(run))


def price_from(args: argparse.Namespace) -> pricing.HostPrice:
    d = pricing.GEX131_OCT_2026
    if args.monthly is None and args.setup is None and args.hourly is None:
        return d if args.price_date is None else _replace_date(d, args.price_date)
    monthly = d.monthly if args.monthly is None else args.monthly
    hourly = args.hourly if args.hourly is not None else (d.hourly if args.monthly is None else None)
    setup = d.setup if args.setup is None else args.setup
    return pricing.HostPrice(d.label, monthly, setup, hourly, args.price_date or "given", "command line")


def _replace_date(p: pricing.HostPrice, date: str) -> pricing.HostPrice:
    return pricing.HostPrice(p.label, p.monthly, p.setup, p.hourly, date, p.source)


def offers_from(values: Sequence[str]) -> tuple[pricing.CloudOffer, ...]:
    if not values:
        return pricing.DEFAULT_OFFERS
    offers = []
    for value in values:
        parts = [p.strip() for p in value.split(",")]
        if len(parts) != 4:
            raise CliFailure(f"--cloud {value!r}: expected NAME,PRICE,CURRENCY,GPU_FRACTION", EXIT_USAGE)
        name, price, currency, fraction = parts
        try:
            num, _, den = fraction.partition("/")
            share = float(num) / float(den or 1)
            offers.append(
                pricing.CloudOffer(name, float(price), pricing.Currency(currency.upper()), share, "?", "given", "")
            )
        except (ValueError, ZeroDivisionError) as exc:
            raise CliFailure(f"--cloud {value!r}: {exc}", EXIT_USAGE) from exc
    return tuple(offers)


def measure(args: argparse.Namespace, model: catalog.GpuModel, now: datetime.datetime) -> usage.Usage:
    window = usage.parse_window(args.window)
    k = kubeargs.connect(args)
    try:
        slices = k.list(kube.RESOURCESLICES, field_selector=f"spec.driver={domain.NVIDIA_DRIVER}")
        nodes = usage.gpu_nodes(slices)
        if args.node:
            nodes &= set(args.node)
        if not nodes:
            wanted = f" on {', '.join(args.node)}" if args.node else ""
            raise CliFailure(f"no {domain.NVIDIA_DRIVER} ResourceSlices{wanted}: no GPU nodes to measure")
        claims = k.list(kube.RESOURCECLAIMS)
    finally:
        k.close()
    return usage.measure(claims, nodes, model, now, window)


def run(args: argparse.Namespace) -> int:
    try:
        model = catalog.builtin_catalog().model(args.gpu)
        terms = pricing.Terms(args.term_months, args.hours_per_month, args.orders_per_month, model.memory_slices)
        price = price_from(args)
        pricing.check_price(price)
        offers = offers_from(args.cloud)
        fx = pricing.FxRate(args.usd_per_eur, args.fx_date or pricing.DEFAULT_FX.as_of, _fx_source(args))
        if args.usd_per_eur <= 0:
            raise CliFailure("--usd-per-eur must be positive", EXIT_USAGE)
        if args.plot is not None:
            cost_plot.check_path(args.plot)
        if args.measured and (args.utilization or args.used_hours):
            raise CliFailure("--measured replaces --utilization/--used-hours; give one", EXIT_USAGE)
        measured = measure(args, model, datetime.datetime.now(datetime.UTC)) if args.measured else None
        if measured is not None:
            utilizations = [measured.utilization]
        else:
            utilizations = [pricing.check_utilization(u) for u in args.utilization]
            utilizations += [pricing.utilization_from_hours(h, terms) for h in args.used_hours]
        scenarios = [pricing.scenario(price, terms, u, offers, fx) for u in utilizations or DEFAULT_UTILIZATIONS]
    except (pricing.CostError, usage.UsageError, catalog.CatalogError, ValueError) as exc:
        raise CliFailure(str(exc), EXIT_USAGE) from exc
    doc = report(price, terms, fx, offers, scenarios, measured)
    standby = args.standby_hosts if args.standby_hosts is not None else (_standby_hosts(args) if args.measured else 0)
    if standby:
        month = pricing.leased_month(price, terms)
        doc["standby"] = {
            "hosts": standby,
            "idle_per_month": round(standby * month, 2),
            "idle_per_hour": round(standby * month / terms.hours_per_month, 4),
        }
    if args.output == "json":
        kubeargs.print_json(doc)
    else:
        print_report(doc)
    if args.plot is not None:
        utilization = None if measured is None else measured.utilization
        _plot(args.plot, lambda: cost_plot.figure(price, terms, fx, offers, scenarios, utilization))
    return EXIT_OK


def _plot(path: Path, draw: Callable[[], Figure]) -> None:
    """``draw`` runs in here: a missing matplotlib shows only when the figure is made."""
    try:
        cost_plot.save(draw(), path)
    except cost_plot.PlotUnavailable as exc:
        raise CliFailure(str(exc), EXIT_USAGE) from exc
    except OSError as exc:
        raise CliFailure(f"--plot {path}: {exc}") from exc
    print(f"chart written to {path}", file=sys.stderr)


def _fx_source(args: argparse.Namespace) -> str:
    same = args.usd_per_eur == pricing.DEFAULT_FX.usd_per_eur and args.fx_date is None
    return pricing.DEFAULT_FX.source if same else "command line"


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def report(
    price: pricing.HostPrice,
    terms: pricing.Terms,
    fx: pricing.FxRate,
    offers: Sequence[pricing.CloudOffer],
    scenarios: Sequence[pricing.Scenario],
    measured: usage.Usage | None,
) -> dict[str, Any]:
    """The whole answer as one JSON-able document; the table is printed from it."""
    seed = pricing.seed_check()
    return {
        "currency": "EUR",
        "vat": "excluded",
        "price": {
            "product": price.label,
            "monthly": price.monthly,
            "hourly": _r(price.hourly_rate),
            "setup": price.setup,
            "as_of": price.as_of,
            "source": price.source,
        },
        "terms": {
            "term_months": terms.term_months,
            "hours_per_month": terms.hours_per_month,
            "orders_per_month": terms.orders_per_month,
            "slices_per_gpu": terms.slices_per_gpu,
        },
        "fx": {"usd_per_eur": fx.usd_per_eur, "as_of": fx.as_of, "source": fx.source},
        "utilization_source": "measured" if measured is not None else "given",
        "measured": None if measured is None else _measured_doc(measured),
        "per_hour_held": _r(pricing.leased_month(price, terms) / terms.hours_per_month),
        "hourly_billing_wins_below_hours": _r(pricing.hourly_wins_below_hours(price, terms), 1),
        "cloud": [
            {
                "name": o.name,
                "hourly": o.hourly,
                "currency": o.currency.value,
                "hourly_eur": _r(fx.to_eur(o.hourly, o.currency)),
                "gpu_fraction": o.gpu_fraction,
                "billing": o.billing,
                "as_of": o.as_of,
                "source": o.source,
                "break_even_utilization": _r(pricing.break_even_utilization(price, terms, o, fx)),
            }
            for o in offers
        ],
        "scenarios": [_scenario_doc(s, terms) for s in scenarios],
        "seed_check": {
            "monthly": seed.monthly,
            "per_hour_730": _r(seed.per_hour_730, 2),
            "per_used_hour_120": _r(seed.per_used_hour_120, 2),
        },
        "caveat": pricing.HOURLY_CAVEAT,
    }


def _scenario_doc(s: pricing.Scenario, terms: pricing.Terms) -> dict[str, Any]:
    return {
        "utilization": _r(s.utilization),
        "used_gpu_hours": _r(s.used_hours, 1),
        "leased": {
            "month": _r(s.leased_month, 2),
            "per_used_gpu_hour": _r(s.leased_per_used_gpu_hour),
            "per_used_slice_hour": _r(s.leased_per_used_slice_hour),
        },
        "hourly_billing": {
            "month": _r(s.hourly_month, 2),
            "per_used_gpu_hour": _r(s.hourly_per_used_gpu_hour),
            "orders_per_month": terms.orders_per_month,
        },
        "cloud": [
            {
                "name": c.offer.name,
                "month": _r(c.month, 2),
                "per_used_gpu_hour": _r(c.per_used_gpu_hour),
                "per_used_slice_hour": _r(c.per_used_slice_hour),
            }
            for c in s.cloud
        ],
    }


def _measured_doc(m: usage.Usage) -> dict[str, Any]:
    return {
        "window_hours": _r(m.window.total_seconds() / 3600, 2),
        "nodes": m.nodes,
        "slices_total": m.slices_total,
        "slice_hours_held": _r(m.slice_hours_held, 2),
        "capacity_slice_hours": _r(m.capacity_slice_hours, 2),
        "utilization": _r(m.utilization),
        "slices_held_now": m.slices_held_now,
        "utilization_now": _r(m.utilization_now),
        "claims": m.claims,
        "unrecognised_devices": list(m.unrecognised),
        "held": [
            {"claim": h.claim, "node": h.pool, "device": h.device, "slices": h.slices, "since": h.since.isoformat()}
            for h in m.held
        ],
        "lower_bound": True,
    }


def _eur(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"€{value:,.{digits}f}"


def print_report(doc: dict[str, Any]) -> None:
    _print_header(doc)
    print()
    _print_rows(_table_rows(doc))
    print()
    _print_notes(doc)


def _print_header(doc: dict[str, Any]) -> None:
    p, t = doc["price"], doc["terms"]
    if p["source"] != "command line":
        basis = f"list price of {p['as_of']}, {p['source']}"
    else:
        basis = "given on the command line" + ("" if p["as_of"] == "given" else f", dated {p['as_of']}")
    print(f"{p['product']}: {_eur(p['monthly'])}/month, {_eur(p['hourly'], 4)}/h, {_eur(p['setup'])} setup")
    print(f"  EUR net of VAT; {basis}")
    print(
        f"  setup spread over {t['term_months']:g} months; {t['hours_per_month']:g} h a month; "
        f"{t['slices_per_gpu']} MIG slices per GPU"
    )
    m = doc["measured"]
    if m is not None:
        print(
            f"measured over {m['window_hours']:g} h on {m['nodes']} node(s): {m['slice_hours_held']:g} of "
            f"{m['capacity_slice_hours']:g} slice-hours held = {m['utilization']:.1%}"
        )
        print(
            f"  a lower bound (released claims are gone from the API); now {m['slices_held_now']}/"
            f"{m['slices_total']} slices held by {m['claims']} claim(s)"
        )
        if m["unrecognised_devices"]:
            print(f"  not counted (unknown device names): {', '.join(m['unrecognised_devices'])}")


def _percent(u: float) -> str:
    return f"{u:.0%}" if round(u * 100, 6) % 1 == 0 else f"{u:.1%}"


def _table_rows(doc: dict[str, Any]) -> list[tuple[str, list[str]]]:
    scenarios, orders = doc["scenarios"], doc["terms"]["orders_per_month"]

    def each(pick: Any) -> list[str]:
        return [pick(s) for s in scenarios]

    rows = [
        ("utilization", each(lambda s: _percent(s["utilization"]))),
        ("used GPU-hours a month", each(lambda s: f"{s['used_gpu_hours']:g}")),
        ("leased: month", each(lambda s: _eur(s["leased"]["month"]))),
        ("leased: per used GPU-hour", each(lambda s: _eur(s["leased"]["per_used_gpu_hour"]))),
        ("leased: per used slice-hour", each(lambda s: _eur(s["leased"]["per_used_slice_hour"]))),
        (f"hourly billing: month ({orders} order)", each(lambda s: _eur(s["hourly_billing"]["month"]))),
        ("hourly billing: per used GPU-hour", each(lambda s: _eur(s["hourly_billing"]["per_used_gpu_hour"]))),
    ]
    for i, offer in enumerate(doc["cloud"]):
        rows.append((f"{offer['name']}: month", each(lambda s, i=i: _eur(s["cloud"][i]["month"]))))
        rows.append(
            (
                f"{offer['name']}: per used GPU-hour{_times(offer)}",
                each(lambda s, i=i: _eur(s["cloud"][i]["per_used_gpu_hour"])),
            )
        )
    return rows


def _times(offer: dict[str, Any]) -> str:
    """How many instances of a partial-GPU offer one GEX131 GPU stands for, as a label suffix."""
    fraction = float(offer["gpu_fraction"])
    return "" if fraction == 1 else f" (x{1 / fraction:g})"


def _standby_hosts(args: argparse.Namespace) -> int:
    """Hosts a standby pool keeps prepared and idle (state Standby, no consumer), cluster-wide."""
    from capi_gpu.kube import ours

    kube = kubeargs.connect(args)
    return sum(
        1
        for h in kube.list(ours("hetznergpuhosts"))
        if (h.get("status") or {}).get("state") == "Standby" and not h["spec"].get("consumerRef")
    )


def _print_notes(doc: dict[str, Any]) -> None:
    t, fx, seed = doc["terms"], doc["fx"], doc["seed_check"]
    if doc.get("standby"):
        sb = doc["standby"]
        print(
            f"standby pool: {sb['hosts']} idle host(s) cost {_eur(sb['idle_per_month'])} a month "
            f"({_eur(sb['idle_per_hour'])}/h) while they wait for a claim"
        )
    for o in doc["cloud"]:
        share = "a whole GPU" if o["gpu_fraction"] == 1 else f"{o['gpu_fraction']:g} of a GPU"
        print(
            f"{o['name']}: {o['currency']} {o['hourly']:g}/h billed {o['billing']} ({o['as_of']}) = "
            f"{_eur(o['hourly_eur'])}/h for {share}; leased is cheaper above "
            f"{o['break_even_utilization']:.1%} utilization"
        )
    print(f"per hour held (100% utilization): {_eur(doc['per_hour_held'])}")
    print(
        f"hourly billing, cancelled and re-ordered {t['orders_per_month']}x a month, is cheaper only below "
        f"{doc['hourly_billing_wins_below_hours']:g} used hours a month"
    )
    print(f"USD converted at {fx['usd_per_eur']:g} USD per EUR ({fx['as_of']}, {fx['source']})")
    print(
        f"seed check: €{seed['monthly']:g}/month = €{seed['per_hour_730']:.2f}/h at 730 h, "
        f"€{seed['per_used_hour_120']:.2f}/h at 120 h used"
    )
    print(f"caveat: {doc['caveat']}")


def _print_rows(rows: Sequence[tuple[str, list[str]]]) -> None:
    label_width = max(len(label) for label, _ in rows)
    widths = [max(len(values[i]) for _, values in rows) for i in range(len(rows[0][1]))]
    for label, values in rows:
        cells = "  ".join(v.rjust(w) for v, w in zip(values, widths, strict=True))
        print(f"{label:<{label_width}}  {cells}")
