"""The Robot simulator's commerce side: products, orders that turn into servers, cancellations.

Orders follow the documented life: ``POST /order/server/transaction`` returns 201 with a transaction
``in process`` and ``server_number: null``; after ``delivery_delay_s`` (sim seconds; an order with a
``comment`` is processed by hand and takes ``manual_delivery_delay_s``) the server appears in
``GET /server`` as ``in process``, and ``handover_s`` later it is ``ready`` and the transaction says
``ready`` with its server number. ``test=true`` validates and answers but orders nothing (it still
counts against the 20/day limit: it is a request to that endpoint).

The GEX131 product carries the 8 Oct 2026 feed: €1,497.30/month, €2.3995/h, €1,499 setup (net;
gross at 19 % VAT), in FSN1 and NBG1. vSwitches live in ``robot_vswitch``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import secrets
from decimal import Decimal
from typing import Any

from capi_gpu_sim.robot_hooks import NewServer
from capi_gpu_sim.robot_world import ApiError, Form, RobotWorld, SimServer, invalid_input

VAT = Decimal("1.19")


def _price(net: str, hourly: str | None = None) -> dict[str, str]:
    def fmt(value: Decimal) -> str:
        return f"{value:.4f}"

    money = {"net": fmt(Decimal(net)), "gross": fmt(Decimal(net) * VAT)}
    if hourly is not None:
        money |= {"hourly_net": fmt(Decimal(hourly)), "hourly_gross": fmt(Decimal(hourly) * VAT)}
    return money


def gex131_product() -> dict[str, Any]:
    locations = ["FSN1", "NBG1"]
    prices = [
        {"location": loc, "price": _price("1497.30", "2.3995"), "price_setup": _price("1499.00")} for loc in locations
    ]
    ipv4_prices = [{"location": loc, "price": _price("1.70"), "price_setup": _price("0")} for loc in locations]
    return {
        "id": "GEX131",
        "name": "Dedicated Server GEX131",
        "description": [
            "NVIDIA RTX PRO 6000 Blackwell Max-Q, 96 GB GDDR7 ECC",
            "Intel Xeon Gold 5412U (24 cores)",
            "256 GB DDR5 ECC reg.",
            "2 x 960 GB NVMe SSD",
        ],
        "traffic": "unlimited",
        "dist": ["Rescue system", "Ubuntu 24.04 LTS base", "Debian 12 base"],
        "lang": ["en"],
        "location": locations,
        "prices": prices,
        "orderable_addons": [{"id": "primary_ipv4", "name": "Primary IPv4", "min": 0, "max": 1, "prices": ipv4_prices}],
    }


class Commerce:
    def __init__(self, world: RobotWorld) -> None:
        self.world = world
        self.products: dict[str, dict[str, Any]] = {"GEX131": gex131_product()}
        self.transactions: dict[str, dict[str, Any]] = {}
        self.new_servers: list[NewServer] = []  # drained by the sim into the hook thread
        self.delivery_delay_s = 600.0
        self.manual_delivery_delay_s = 2 * 86400.0
        self.handover_s = 60.0
        self._numbers = itertools.count(900000)

    # --- products ------------------------------------------------------------------------------

    def list_products(self, query: dict[str, str]) -> tuple[int, Any]:
        location = query.get("location")
        found = [p for p in self.products.values() if location is None or location.upper() in p["location"]]
        if not found:
            raise ApiError(404, "NOT_FOUND", "no product matches")
        return 200, [{"product": p} for p in found]

    def get_product(self, product_id: str) -> tuple[int, Any]:
        if product_id not in self.products:
            raise ApiError(404, "NOT_FOUND", "product not found")
        return 200, {"product": self.products[product_id]}

    # --- orders --------------------------------------------------------------------------------

    def order(self, form: Form) -> tuple[int, Any]:
        product = self.products.get(form.required("product_id"))
        if product is None:
            raise invalid_input(invalid=["product_id"])
        location = form.required("location").upper()
        if location not in product["location"]:
            raise invalid_input(invalid=["location"])
        keys, password = form.many("authorized_key"), form.one("password")
        if not keys and not password:
            raise invalid_input(missing=["authorized_key", "password"])
        if keys and password:
            raise invalid_input(invalid=["password"])
        if any(fp not in self.world.keys for fp in keys):
            raise invalid_input(invalid=["authorized_key"])
        dist = form.one("dist") or "Rescue system"
        if dist not in product["dist"]:
            raise invalid_input(invalid=["dist"])
        addons = form.many("addon")
        if any(a not in {o["id"] for o in product["orderable_addons"]} for a in addons):
            raise invalid_input(invalid=["addon"])
        transaction = self._transaction(product, location, keys, dist, form.one("lang") or "en", addons, form)
        if form.one("test") == "true":
            return 201, {"transaction": transaction}
        self.transactions[transaction["id"]] = transaction
        manual = bool(transaction["comment"])
        delay = self.manual_delivery_delay_s if manual else self.delivery_delay_s
        self.world.schedule(delay, lambda: self._deliver(transaction, location))
        return 201, {"transaction": transaction}

    def _transaction(
        self,
        product: dict[str, Any],
        location: str,
        keys: list[str],
        dist: str,
        lang: str,
        addons: list[str],
        form: Form,
    ) -> dict[str, Any]:
        date = self.world.date().strftime("%Y%m%d")
        refs = [self._key_ref(fp) for fp in keys]
        return {
            "id": f"B{date}-{secrets.randbelow(10**7):07d}-{secrets.randbelow(10**6):06d}",
            "date": self.world.iso_now(),
            "status": "in process",
            "server_number": None,
            "server_ip": None,
            "authorized_key": refs,
            "host_key": [],
            "comment": form.one("comment"),
            "product": {
                "id": product["id"],
                "name": product["name"],
                "description": product["description"],
                "traffic": product["traffic"],
                "dist": dist,
                "lang": lang,
                "location": location,
            },
            "addons": addons,
        }

    def _key_ref(self, fp: str) -> dict[str, Any]:
        key = self.world.keys[fp]
        return {"key": {"name": key.name, "fingerprint": fp, "type": key.type, "size": key.size}}

    def _deliver(self, transaction: dict[str, Any], location: str) -> None:
        number = next(self._numbers)
        octet = number % 250 + 1
        server = SimServer(
            number=number,
            name=f"server{number}",
            ip=f"192.0.2.{octet}",
            ipv6_net=f"2001:db8:{number % 65536:x}::",
            product=transaction["product"]["id"],
            dc=f"{location}-DC14",
            status="in process",
        )
        self.world.servers[number] = server
        self.new_servers.append(NewServer(number, server.name, server.ip, server.product, server.dc))

        def handed_over() -> None:
            server.status = "ready"
            transaction.update(status="ready", server_number=number, server_ip=server.ip)

        self.world.schedule(self.handover_s, handed_over)

    def list_transactions(self) -> tuple[int, Any]:
        if not self.transactions:
            raise ApiError(404, "NOT_FOUND", "no transactions in the last 30 days")
        return 200, [{"transaction": t} for t in self.transactions.values()]

    def get_transaction(self, transaction_id: str) -> tuple[int, Any]:
        if transaction_id not in self.transactions:
            raise ApiError(404, "NOT_FOUND", "transaction not found")
        return 200, {"transaction": self.transactions[transaction_id]}

    # --- cancellation --------------------------------------------------------------------------

    def _cancellation(self, server: SimServer) -> dict[str, Any]:
        state = server.cancellation or {}
        body = {
            **server.address(),
            "server_name": server.name,
            "earliest_cancellation_date": self.world.date().isoformat(),
            "cancelled": server.cancelled,
            "reservation_possible": False,
            "reserved": bool(state.get("reserved")),
            "cancellation_date": state.get("date"),
            "cancellation_reason": state.get("reason") if server.cancelled else ["Upgrade", "No longer needed"],
        }
        return {"cancellation": body}

    def get_cancellation(self, n: str) -> tuple[int, Any]:
        return 200, self._cancellation(self.world.server(n))

    def cancel(self, n: str, form: Form) -> tuple[int, Any]:
        server = self.world.server(n)
        raw_date = form.required("cancellation_date")
        if server.cancelled:
            raise ApiError(409, "CONFLICT", "the server is already cancelled")
        if raw_date == "now":
            date = self.world.date()
        else:
            try:
                date = dt.date.fromisoformat(raw_date)
            except ValueError as exc:
                raise invalid_input(invalid=["cancellation_date"]) from exc
            if date < self.world.date():
                raise invalid_input(invalid=["cancellation_date"])
        if form.one("reserve_location") == "true":
            raise ApiError(409, "SERVER_CANCELLATION_RESERVE_LOCATION_FALSE_ONLY", "reservation not possible")
        server.cancelled = True
        server.cancellation = {"date": date.isoformat(), "reason": form.one("cancellation_reason"), "reserved": False}
        return 200, self._cancellation(server)
