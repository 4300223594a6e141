"""Packing planner: how many nodes of which MIG layout cover the pending GPU claims at least cost.

The claim-aware scaler sees pending claims (each one MIG device, possibly a ``firstAvailable`` list of
profiles, or a whole GPU) and MachineDeployments whose nodes come with a fixed layout and a price. It
must pick node counts, which cluster-autoscaler cannot do for MIG claims. A claim is served by one
device of one of its alternatives; a node offers its layout's devices (or one whole GPU when MIG is
off). Given node counts, whether every claim fits is a bipartite b-matching, solved here as a max-flow
on a graph of claim groups and profiles; among the feasible assignments a min-cost flow prefers each
claim's earlier alternatives, as the scheduler does.

Choosing the counts is a small covering integer program, solved by branch and bound:

* options are ordered by cost per memory slice; each option's count is bounded by the number of its
  nodes that alone would serve every claim it can serve (more of them never helps);
* a branch is cut when its cost plus a lower bound on the rest reaches the best plan found. The bound
  is the larger of the slice bound (missing slices at the cheapest cost per slice, or in whole nodes)
  and Hall bounds: claims whose alternatives all lie in a profile set T need that many T devices,
  which only some options offer. The last option's count is found by bisection;
* the incumbent starts from a greedy plan (add the option serving the most new claims per unit cost,
  then drop nodes that are not needed), so the search mostly proves it optimal.

The lower bound reported is that bound for the whole demand, or the plan's own cost when the search
finished (the plan is then optimal). When ``max_explored`` search nodes do not suffice, the plan is
the best found, ``optimal`` is False and the gap to ``lower_bound`` is known. Pure: no I/O, no clock.

Limits: a claim is one device (the shipped templates' gate request needs no capacity); several claims
on one node are independent. Scheduling order can still defeat a plan when a ``firstAvailable`` claim
takes a larger device another claim needed; the preferred assignment keeps that rare, not impossible.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from capi_gpu.gpu import catalog, layout

WHOLE_GPU = "gpu"  # the device a node with MIG disabled offers (DRA class gpu.nvidia.com)


class PackingError(ValueError):
    """Some claims cannot be served by any node option."""


@dataclass(frozen=True, slots=True)
class Request:
    """``count`` identical claims, each wanting one device of the first available alternative."""

    alternatives: tuple[str, ...]
    count: int = 1

    @classmethod
    def exact(cls, profile: str, count: int = 1) -> Request:
        return cls((profile,), count)

    @classmethod
    def first_available(cls, *profiles: str, count: int = 1) -> Request:
        return cls(tuple(profiles), count)

    @classmethod
    def whole_gpu(cls, count: int = 1) -> Request:
        return cls((WHOLE_GPU,), count)


@dataclass(frozen=True, slots=True)
class NodeOption:
    """A kind of node the scaler can add: the devices one node offers, and what it costs."""

    name: str
    devices: tuple[tuple[str, int], ...]
    cost: float
    slices: int  # memory slices the offered devices span (bounds only)


def mig_option(model: catalog.GpuModel, name: str, spec: str | Mapping[str, int], cost: float) -> NodeOption:
    """A node with a validated MIG layout."""
    chosen = layout.parse_layout(spec)
    layout.validate(model, chosen)
    slices = sum(model.profile(p).memory_slices * n for p, n in chosen.counts)
    return NodeOption(name, chosen.counts, cost, slices)


def whole_gpu_option(model: catalog.GpuModel, cost: float, name: str = "whole-gpu") -> NodeOption:
    """A node with MIG disabled: one whole GPU."""
    return NodeOption(name, ((WHOLE_GPU, 1),), cost, model.memory_slices)


@dataclass(frozen=True, slots=True)
class Plan:
    nodes: tuple[tuple[str, int], ...]  # option name -> node count (non-zero only)
    cost: float
    assignment: tuple[tuple[tuple[str, ...], str, int], ...]  # (alternatives, device profile, claims)
    lower_bound: float
    optimal: bool
    explored: int

    @property
    def node_count(self) -> int:
        return sum(n for _, n in self.nodes)


def request_slices(model: catalog.GpuModel, request: Request) -> int:
    """The fewest memory slices any of the request's alternatives takes."""
    return min(model.memory_slices if a == WHOLE_GPU else model.profile(a).memory_slices for a in request.alternatives)


class _Problem:
    def __init__(self, model: catalog.GpuModel, demand: Sequence[Request], options: Sequence[NodeOption]) -> None:
        merged: dict[tuple[str, ...], int] = {}
        for r in demand:
            if r.count < 0 or not r.alternatives:
                raise PackingError(f"request {r} needs alternatives and a non-negative count")
            merged[r.alternatives] = merged.get(r.alternatives, 0) + r.count
        self.groups = [(alts, n) for alts, n in merged.items() if n]
        self.model = model
        self.options = sorted(options, key=lambda o: (o.cost / max(o.slices, 1), o.cost, o.name))
        self.profiles = sorted({p for o in self.options for p, _ in o.devices})
        self.demand_slices = sum(request_slices(model, Request(a)) * n for a, n in self.groups)
        self.units = sum(n for _, n in self.groups)
        # Hall-type bounds: claims whose alternatives all lie in T need that many devices from T.
        sets = {frozenset(a) for a, _ in self.groups}
        if len(sets) <= 6:
            sets = {frozenset().union(*c) for k in range(1, len(sets) + 1) for c in itertools.combinations(sets, k)}
        self.hall = [
            (
                t,
                sum(n for a, n in self.groups if set(a) <= t),
                [sum(k for p, k in o.devices if p in t) for o in self.options],
            )
            for t in sets
        ]

    def supply(self, counts: Sequence[int]) -> dict[str, int]:
        out: dict[str, int] = {}
        for option, n in zip(self.options, counts, strict=False):
            for p, k in option.devices:
                out[p] = out.get(p, 0) + k * n
        return out

    def served(self, counts: Sequence[int]) -> int:
        return _flow(self.groups, self.supply(counts))[0]

    def feasible(self, counts: Sequence[int]) -> bool:
        return self.served(counts) == self.units

    def cost(self, counts: Sequence[int]) -> float:
        return sum(o.cost * n for o, n in zip(self.options, counts, strict=False))

    def upper(self, i: int) -> int:
        alone = [0] * len(self.options)
        best = self.served([*alone[:i], 10**9, *alone[i + 1 :]])
        lo, hi = 0, self.units
        while lo < hi:
            mid = (lo + hi) // 2
            alone[i] = mid
            if self.served(alone) >= best:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def bound(self, first: int, counts: Sequence[int]) -> float:
        """Least cost of what is still missing after ``counts[:first]``, using options ``first`` onwards:
        the larger of the slice bound and, for each Hall set T, the devices from T still missing."""
        rest = range(first, len(self.options))
        supplied = sum(self.options[i].slices * counts[i] for i in range(first))
        missing = max(0, self.demand_slices - supplied)
        worst = 0.0
        if missing:
            if not rest:
                return math.inf
            per_slice = missing * min(self.options[i].cost / max(self.options[i].slices, 1) for i in rest)
            most = max(1, *(self.options[i].slices for i in rest))
            worst = max(per_slice, math.ceil(missing / most) * min(self.options[i].cost for i in rest))
        for _t, need, per_node in self.hall:
            short = need - sum(per_node[i] * counts[i] for i in range(first))
            if short <= 0:
                continue
            useful = [i for i in rest if per_node[i]]
            if not useful:
                return math.inf
            nodes = math.ceil(short / max(per_node[i] for i in useful))
            per_device = short * min(self.options[i].cost / per_node[i] for i in useful)
            worst = max(worst, per_device, nodes * min(self.options[i].cost for i in useful))
        return worst


def plan(
    model: catalog.GpuModel,
    demand: Sequence[Request],
    options: Sequence[NodeOption],
    *,
    max_explored: int = 200_000,
) -> Plan:
    """The cheapest node counts covering ``demand``; see the module docstring for the method."""
    prob = _Problem(model, demand, options)
    if not prob.options:
        raise PackingError("no node options to choose from")
    everything = [prob.upper(i) for i in range(len(prob.options))]
    if not prob.feasible(everything):
        raise PackingError(f"no node option serves: {', '.join(_unservable(prob))}")
    root_bound = prob.bound(0, [0] * len(prob.options))
    best = _greedy(prob)
    best_cost = prob.cost(best)
    explored = 0
    counts = [0] * len(prob.options)

    def search(i: int, cost: float) -> bool:
        nonlocal best, best_cost, explored
        explored += 1
        if explored > max_explored:
            return False
        if cost + prob.bound(i, counts) >= best_cost - 1e-9:
            return True
        if i == len(prob.options) - 1:
            n = _least_last(prob, counts, everything[i])
            if n is not None and cost + n * prob.options[i].cost < best_cost - 1e-9:
                best = [*counts[:i], n]
                best_cost = prob.cost(best)
            return True
        for n in range(everything[i], -1, -1):
            counts[i] = n
            if not search(i + 1, cost + n * prob.options[i].cost):
                counts[i] = 0
                return False
        counts[i] = 0
        return True

    finished = search(0, 0.0)
    return Plan(
        nodes=tuple((o.name, n) for o, n in zip(prob.options, best, strict=True) if n),
        cost=best_cost,
        assignment=_assignment(prob, best),
        lower_bound=best_cost if finished else root_bound,
        optimal=finished,
        explored=explored,
    )


def slice_lower_bound_nodes(model: catalog.GpuModel, demand: Sequence[Request]) -> int:
    """``ceil(total slices / slices per GPU)``: no packing can use fewer nodes."""
    total = sum(request_slices(model, r) * r.count for r in demand)
    return math.ceil(total / model.memory_slices)


def _least_last(prob: _Problem, counts: list[int], upper: int) -> int | None:
    i = len(prob.options) - 1
    counts[i] = upper
    if not prob.feasible(counts):
        counts[i] = 0
        return None
    lo, hi = 0, upper
    while lo < hi:
        counts[i] = (lo + hi) // 2
        if prob.feasible(counts):
            hi = counts[i]
        else:
            lo = counts[i] + 1
    counts[i] = 0
    return lo


def _greedy(prob: _Problem) -> list[int]:
    counts = [0] * len(prob.options)
    served = prob.served(counts)
    while served < prob.units:
        gains = []
        for i, option in enumerate(prob.options):
            counts[i] += 1
            gains.append(((prob.served(counts) - served) / option.cost, option.slices, -i))
            counts[i] -= 1
        gain, _, neg_i = max(gains)
        if gain <= 0:
            raise PackingError(f"no node option serves: {', '.join(_unservable(prob))}")
        counts[-neg_i] += 1
        served = prob.served(counts)
    for i in sorted(range(len(counts)), key=lambda j: -prob.options[j].cost):
        while counts[i] and prob.feasible([*counts[:i], counts[i] - 1, *counts[i + 1 :]]):
            counts[i] -= 1
    return counts


def _unservable(prob: _Problem) -> list[str]:
    offered = set(prob.profiles)
    return ["|".join(alts) for alts, _ in prob.groups if not offered & set(alts)]


def _assignment(prob: _Problem, counts: Sequence[int]) -> tuple[tuple[tuple[str, ...], str, int], ...]:
    _, flows = _flow(prob.groups, prob.supply(counts), prefer=True)
    return tuple((alts, p, f) for (alts, _), row in zip(prob.groups, flows, strict=True) for p, f in row.items() if f)


def _flow(
    groups: Sequence[tuple[tuple[str, ...], int]], supply: Mapping[str, int], *, prefer: bool = False
) -> tuple[int, list[dict[str, int]]]:
    """Max flow source -> claim groups -> profiles -> sink; with ``prefer`` the min-cost one, where
    using a claim's k-th alternative costs k."""
    profiles = sorted(p for p, n in supply.items() if n > 0)
    pidx = {p: 1 + len(groups) + i for i, p in enumerate(profiles)}
    sink = 1 + len(groups) + len(profiles)
    g = _Graph(sink + 1)
    links: list[dict[str, int]] = []
    for i, (alts, need) in enumerate(groups):
        g.add(0, 1 + i, need, 0)
        links.append(
            {p: g.add(1 + i, pidx[p], need, rank if prefer else 0) for rank, p in enumerate(alts) if p in pidx}
        )
    for p in profiles:
        g.add(pidx[p], sink, supply[p], 0)
    total = g.min_cost_flow(0, sink)
    return total, [{p: g.cap[e ^ 1] for p, e in row.items()} for row in links]


class _Graph:
    """Residual graph for successive-shortest-path min-cost flow (tiny: claim groups x profiles)."""

    def __init__(self, n: int) -> None:
        self.adj: list[list[int]] = [[] for _ in range(n)]
        self.to: list[int] = []
        self.cap: list[int] = []
        self.cost: list[int] = []

    def add(self, u: int, v: int, cap: int, cost: int) -> int:
        for a, b, c, w in ((u, v, cap, cost), (v, u, 0, -cost)):
            self.adj[a].append(len(self.to))
            self.to.append(b)
            self.cap.append(c)
            self.cost.append(w)
        return len(self.to) - 2

    def min_cost_flow(self, s: int, t: int) -> int:
        total = 0
        while True:
            dist = [math.inf] * len(self.adj)
            prev = [-1] * len(self.adj)
            dist[s] = 0
            for _ in range(len(self.adj)):  # Bellman-Ford: residual edges may have negative cost
                changed = False
                for u, edges in enumerate(self.adj):
                    if dist[u] == math.inf:
                        continue
                    for e in edges:
                        if self.cap[e] > 0 and dist[u] + self.cost[e] < dist[self.to[e]]:
                            dist[self.to[e]] = dist[u] + self.cost[e]
                            prev[self.to[e]] = e
                            changed = True
                if not changed:
                    break
            if dist[t] == math.inf:
                return total
            amount, v = math.inf, t
            while v != s:
                amount = min(amount, self.cap[prev[v]])
                v = self.to[prev[v] ^ 1]
            v = t
            while v != s:
                self.cap[prev[v]] -= int(amount)
                self.cap[prev[v] ^ 1] += int(amount)
                v = self.to[prev[v] ^ 1]
            total += int(amount)
