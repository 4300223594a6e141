"""`capi-gpu hosts order`: buy a Robot server, an ops action that costs money and is never automatic.

A GEX131 costs a one-time setup fee (€1,499 in the Oct 2026 feed) on every order, and Robot allows 20
order requests a day, so ordering is kept out of every scale-up path: the controllers only lease
servers that already exist. This command makes the cost visible before anything happens:

1. it reads the product from ``GET /order/server/product/{id}`` and prints the monthly, hourly and
   setup price for the location (net, EUR, as Robot lists them);
2. ``--dry-run`` sends the order with ``test=true`` (Robot validates it, nothing is bought);
3. a real order needs ``--yes-i-want-to-pay``; without it the command stops after the price (exit 2).

Root access to the new server is by SSH key fingerprint (``--authorized-key``), never a password on
the command line. Credentials come from ``HETZNER_ROBOT_USER`` / ``HETZNER_ROBOT_PASSWORD``;
``--robot-url`` points it at the simulator. ``hosts.py`` (the ``hosts`` group) calls ``register_order``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from decimal import Decimal
from typing import Any

from capi_gpu.cli import EXIT_EXTERNAL, EXIT_OK, EXIT_USAGE
from capi_gpu.hetzner import errors, models, robot, transport

USER_ENV = "HETZNER_ROBOT_USER"
PASSWORD_ENV = "HETZNER_ROBOT_PASSWORD"  # the variable holding it, not a password


def register_order(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("order", help="order a Robot server (costs a setup fee; prints the price first)")
    p.add_argument("--product", required=True, help="Robot product id, e.g. GEX131")
    p.add_argument("--location", required=True, help="FSN1, NBG1, ...")
    p.add_argument(
        "--authorized-key",
        action="append",
        default=[],
        metavar="FINGERPRINT",
        help="Robot key fingerprint for root access (repeatable; at least one)",
    )
    p.add_argument("--dist", default="Rescue system", help="preinstalled system (default: Rescue system)")
    p.add_argument("--addon", action="append", default=[], help="orderable add-on id, e.g. primary_ipv4")
    p.add_argument("--dry-run", action="store_true", help="send the order with test=true; nothing is bought")
    p.add_argument("--yes-i-want-to-pay", dest="confirmed", action="store_true", help="really place the order")
    p.add_argument("--robot-url", default=transport.ROBOT_URL, help="Robot webservice URL (the simulator's in tests)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.set_defaults(func=run_order)


def _fail(message: str, code: int) -> int:
    print(message, file=sys.stderr)
    return code


def _price_doc(product: models.Product, location: str) -> dict[str, Any] | None:
    price = product.price_at(location)
    if price is None:
        return None

    def text(value: Decimal | None) -> str | None:
        return None if value is None else f"{value:.2f}" if value >= 10 else f"{value:.4f}"

    return {
        "currency": "EUR",
        "monthly_net": text(price.price.net),
        "monthly_gross": text(price.price.gross),
        "hourly_net": text(price.price.hourly_net),
        "setup_net": text(price.price_setup.net),
        "setup_gross": text(price.price_setup.gross),
    }


def _print_table(doc: dict[str, Any]) -> None:
    price = doc["price"]
    rows = [
        ("product", doc["product"]),
        ("location", doc["location"]),
        ("monthly (net)", f"€{price['monthly_net']}"),
        ("hourly (net)", f"€{price['hourly_net']}" if price["hourly_net"] else "-"),
        ("setup fee (net)", f"€{price['setup_net']}  (charged on every order)"),
    ]
    transaction = doc.get("transaction")
    if transaction is not None:
        rows += [
            ("mode", "dry run (test=true): nothing was bought" if doc["dry_run"] else "ORDER PLACED"),
            ("transaction", transaction["id"]),
            ("status", transaction["status"]),
        ]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        print(f"{key.upper():<{width}}  {value}")


def _emit(doc: dict[str, Any], output: str) -> None:
    if output == "json":
        print(json.dumps(doc))
    else:
        _print_table(doc)


async def _order(args: argparse.Namespace, client: robot.RobotClient) -> int:
    product = await client.get_product(args.product)
    location = args.location.upper()
    price = _price_doc(product, location)
    if price is None:
        offered = ", ".join(product.location) or "none"
        return _fail(f"{product.id} is not offered in {location} (offered: {offered})", EXIT_USAGE)
    doc: dict[str, Any] = {"product": product.id, "location": location, "price": price, "dry_run": args.dry_run}
    if not args.dry_run and not args.confirmed:
        doc |= {"transaction": None, "refused": "a real order needs --yes-i-want-to-pay (or use --dry-run)"}
        _emit(doc, args.output)
        return _fail(f"refusing to order: {doc['refused']}", EXIT_USAGE)
    order = models.OrderRequest(
        product_id=product.id, location=location, authorized_keys=args.authorized_key, dist=args.dist, addons=args.addon
    )
    transaction = await client.order_server(order, test=args.dry_run)
    doc["transaction"] = transaction.model_dump(mode="json", include={"id", "date", "status", "server_number"})
    _emit(doc, args.output)
    return EXIT_OK


async def _run(args: argparse.Namespace, username: str, password: str) -> int:
    try:
        async with robot.RobotClient(username, password, base_url=args.robot_url) as client:
            return await _order(args, client)
    except errors.RobotTransientError as exc:
        hint = "" if args.dry_run else "; the order may have been placed: check the transactions before retrying"
        return _fail(f"Robot failed: {exc.code} {exc.message}{hint}", EXIT_EXTERNAL)
    except errors.RobotError as exc:
        return _fail(f"Robot refused: {exc.code} {exc.message}".rstrip(), EXIT_EXTERNAL)


def run_order(args: argparse.Namespace) -> int:
    username, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if not username or not password:
        return _fail(f"set {USER_ENV} and {PASSWORD_ENV} (a Robot webservice user)", EXIT_USAGE)
    if not args.authorized_key:
        return _fail("--authorized-key FINGERPRINT is required (root access by key, never a password)", EXIT_USAGE)
    try:
        transport.check_url(args.robot_url)
    except ValueError as exc:
        return _fail(str(exc), EXIT_USAGE)
    return asyncio.run(_run(args, username, password))
