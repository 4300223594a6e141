"""The claim-aware scaler's decision, pure: pending device demand, free and coming devices, and the
autoscaled MachineDeployments in; which of them to raise to how many replicas out.

Rules, in order:

1. **Supply first.** Pending claims are matched against the devices that exist and are free and against
   the devices of nodes still coming (replicas of *any* GPU MachineDeployment, whoever owns it, whose
   node publishes no slices yet). Only what that leaves is demand. Counting coming nodes is what keeps
   the next pass from adding a second node while the first one installs (an hour on bare metal), and
   what keeps this scaler from repeating a scale-up cluster-autoscaler already made.
2. **Only owned groups grow.** A group is a candidate when its owner annotation says ``claim-scaler`` and
   it has headroom (max - replicas). Groups owned by cluster-autoscaler only contribute supply.
3. **Cheapest cover.** The packing planner picks node counts over the candidates: fewest nodes first,
   then the lowest sum of the groups' cost annotations. A group without one ranks above every priced one.
4. **Max is a hard bound.** A plan that exceeds a group's headroom is cut to it and the rest of the demand
   is planned again over the other groups; what no plan covers is added greedily (most claims per node)
   while headroom lasts. What remains is reported, with the reason, never forced.
5. **Never lower.** The target is ``max(min, replicas + added)``, capped at max; a group with nothing to
   add keeps its replicas, even below min. Scale-down stays with cluster-autoscaler or a human.

Matching is a maximum b-matching (augmenting paths) that tries each claim's alternatives in order, so a
``firstAvailable`` claim takes its first choice whenever that costs no other claim its device.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import assert_never

from capi_gpu.gpu import catalog, packing
from capi_gpu.gpu.packing import Request


@dataclass(frozen=True, slots=True)
class Group:
    """One autoscaled MachineDeployment as the decision sees it."""

    name: str
    model: catalog.GpuModel
    devices: tuple[tuple[str, int], ...]  # what one node offers: MIG profile (or packing.WHOLE_GPU) -> count
    replicas: int
    min_size: int
    max_size: int
    owned: bool  # the owner annotation says claim-scaler
    cost: float | None = None
    coming: int = 0  # replicas whose node publishes no devices yet

    @property
    def headroom(self) -> int:
        return max(0, self.max_size - self.replicas) if self.owned else 0


@dataclass(frozen=True, slots=True)
class ScaleUp:
    group: str
    current: int
    target: int
    serves: tuple[tuple[str, int], ...]  # device profile -> pending claims the new nodes are for

    def message(self) -> str:
        what = ", ".join(f"{n}x {p}" for p, n in self.serves) or "the minimum size"
        return f"{self.current}->{self.target} for {what} pending"


class Shortfall(StrEnum):
    """Why pending demand gets no node."""

    NOT_OFFERED = "NotOffered"
    OWNED_BY_CLUSTER_AUTOSCALER = "OwnedByClusterAutoscaler"
    AT_MAX_SIZE = "AtMaxSize"

    def describe(self) -> str:
        match self:
            case Shortfall.NOT_OFFERED:
                return "no autoscaled MachineDeployment's layout offers it"
            case Shortfall.OWNED_BY_CLUSTER_AUTOSCALER:
                return "only MachineDeployments owned by cluster-autoscaler offer it"
            case Shortfall.AT_MAX_SIZE:
                return "the claim-scaler MachineDeployments offering it are at their max size"
            case _:
                assert_never(self)


@dataclass(frozen=True, slots=True)
class Unserved:
    alternatives: tuple[str, ...]
    count: int
    why: Shortfall

    def message(self) -> str:
        return f"{self.count}x {'|'.join(self.alternatives)}: {self.why.describe()}"


@dataclass(frozen=True, slots=True)
class Decision:
    scale_ups: tuple[ScaleUp, ...]
    covered: int  # pending claims the free and coming devices already cover
    unserved: tuple[Unserved, ...]


def units(demand: Iterable[Request]) -> int:
    return sum(r.count for r in demand)


def match(demand: Sequence[Request], supply: Mapping[str, int]) -> tuple[dict[str, int], list[Request]]:
    """A maximum assignment of claims to devices: (claims per device profile, what is left unmatched)."""
    units_ = [r.alternatives for r in sorted(demand, key=lambda r: len(r.alternatives)) for _ in range(r.count)]
    left = {p: n for p, n in supply.items() if n > 0}
    holders: dict[str, list[int]] = {}
    got: list[str | None] = [None] * len(units_)

    def place(i: int, seen: set[str]) -> bool:
        for p in units_[i]:
            if left.get(p, 0) > 0:
                left[p] -= 1
                holders.setdefault(p, []).append(i)
                got[i] = p
                return True
        for p in units_[i]:
            if p in seen or not holders.get(p):
                continue
            seen.add(p)
            for j in list(holders[p]):
                if place(j, seen):  # j moved to another device (p is full and seen, so not back to p)
                    holders[p].remove(j)
                    holders[p].append(i)
                    got[i] = p
                    return True
        return False

    for i in range(len(units_)):
        place(i, set())
    served = Counter(p for p in got if p is not None)
    rest = Counter(units_[i] for i, p in enumerate(got) if p is None)
    return dict(served), [Request(alts, n) for alts, n in rest.items()]


def node_supply(group: Group, nodes: int) -> dict[str, int]:
    return {p: k * nodes for p, k in group.devices}


def decide(demand: Sequence[Request], free: Mapping[str, int], groups: Sequence[Group]) -> Decision:
    """See the module docstring for the rules."""
    supply: Counter[str] = Counter(free)
    for g in groups:
        supply.update(node_supply(g, g.coming))
    _, residual = match(demand, supply)
    covered = units(demand) - units(residual)
    added: dict[str, int] = {}
    candidates = [g for g in groups if g.headroom > 0]
    for key in sorted({g.model.key for g in candidates}):
        residual = _grow([g for g in candidates if g.model.key == key], residual, added)
    ups = []
    # Attribution: which of the claims left after the free and coming devices the new nodes are for.
    _, remaining = match(demand, supply)
    served_by_new, _ = match(remaining, _total_supply(groups, added))
    for g in sorted(groups, key=lambda g: g.name):
        n = added.get(g.name, 0)
        target = min(g.max_size, max(g.min_size, g.replicas + n))
        if n and target > g.replicas:
            serves = _attribute(served_by_new, node_supply(g, n))
            ups.append(ScaleUp(g.name, g.replicas, target, serves))
    return Decision(tuple(ups), covered, tuple(_why(r, groups) for r in sorted(residual, key=_order)))


def _grow(cands: list[Group], residual: list[Request], added: dict[str, int]) -> list[Request]:
    """Add nodes of ``cands`` (one GPU model) for what they can serve of ``residual``; returns the rest."""
    model = cands[0].model
    pool = list(cands)
    wanted, aside = _split(residual, pool)
    while wanted and pool:
        try:
            plan = packing.plan(model, _restrict(wanted, pool), _options(pool, units(wanted)))
        except packing.PackingError:
            break
        counts = dict(plan.nodes)
        over = [g for g in pool if counts.get(g.name, 0) > _left(g, added)]
        if not over:
            for name, n in counts.items():
                added[name] = added.get(name, 0) + n
            _, wanted = match(wanted, _total_supply(pool, counts))
            break
        for g in over:
            n = _left(g, added)
            added[g.name] = added.get(g.name, 0) + n
            _, wanted = match(wanted, node_supply(g, n))
            pool.remove(g)
        wanted, more = _split(wanted, pool)
        aside += more
    return aside + _fill(wanted, cands, added)


def _fill(wanted: list[Request], cands: list[Group], added: dict[str, int]) -> list[Request]:
    """Greedy, one node at a time, where the planner's plan does not fit the headroom."""
    while wanted:
        best: tuple[tuple[int, float], Group] | None = None
        for g in sorted(cands, key=lambda g: g.name):
            if _left(g, added) <= 0:
                continue
            _, rest = match(wanted, node_supply(g, 1))
            key = (units(wanted) - units(rest), -(g.cost if g.cost is not None else float("inf")))
            if key[0] and (best is None or key > best[0]):
                best = (key, g)
        if best is None:
            return wanted
        added[best[1].name] = added.get(best[1].name, 0) + 1
        _, wanted = match(wanted, node_supply(best[1], 1))
    return wanted


def _left(g: Group, added: Mapping[str, int]) -> int:
    return g.headroom - added.get(g.name, 0)


def _offered(groups: Iterable[Group]) -> set[str]:
    return {p for g in groups for p, _ in g.devices}


def _split(demand: list[Request], groups: Sequence[Group]) -> tuple[list[Request], list[Request]]:
    offered = _offered(groups)
    served = [r for r in demand if offered & set(r.alternatives)]
    return served, [r for r in demand if not offered & set(r.alternatives)]


def _restrict(demand: list[Request], groups: Sequence[Group]) -> list[Request]:
    """The planner sizes alternatives from the model's catalog: drop the ones these groups never offer."""
    offered = _offered(groups)
    return [Request(tuple(a for a in r.alternatives if a in offered), r.count) for r in demand]


def _options(pool: Sequence[Group], demand_units: int) -> list[packing.NodeOption]:
    """Node options whose cost orders plans by node count first, then by the groups' cost annotations:
    each node costs 1 plus a share of 1 / (demand_units + 1), and a minimal plan has at most that many nodes."""
    known = [g.cost for g in pool if g.cost is not None]
    unpriced = max(known, default=0.0) + 1.0 if known else 0.0
    rank = {g.name: g.cost if g.cost is not None else unpriced for g in pool}
    scale = max(rank.values(), default=0.0) or 1.0
    out = []
    for g in pool:
        slices = sum(packing.request_slices(g.model, Request.exact(p)) * k for p, k in g.devices)
        out.append(packing.NodeOption(g.name, g.devices, 1.0 + rank[g.name] / (scale * (demand_units + 1)), slices))
    return out


def _total_supply(groups: Iterable[Group], counts: Mapping[str, int]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for g in groups:
        total.update(node_supply(g, counts.get(g.name, 0)))
    return dict(total)


def _attribute(served: dict[str, int], offered: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Hand the new nodes' matched claims to this group, profile by profile (consumes ``served``)."""
    out = []
    for p in sorted(offered):
        n = min(served.get(p, 0), offered[p])
        if n:
            served[p] -= n
            out.append((p, n))
    return tuple(out)


def _why(r: Request, groups: Sequence[Group]) -> Unserved:
    wanted = set(r.alternatives)
    offering = [g for g in groups if wanted & {p for p, _ in g.devices}]
    if not offering:
        why = Shortfall.NOT_OFFERED
    elif not any(g.owned for g in offering):
        why = Shortfall.OWNED_BY_CLUSTER_AUTOSCALER
    else:
        why = Shortfall.AT_MAX_SIZE
    return Unserved(r.alternatives, r.count, why)


def _order(r: Request) -> tuple[tuple[str, ...], int]:
    return r.alternatives, r.count
