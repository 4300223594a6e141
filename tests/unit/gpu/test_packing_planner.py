"""Packing planner: covers demand exactly, prefers first alternatives, matches brute force on random instances,
reports bounds and non-optimal stops, refuses unservable demand."""

from __future__ import annotations

import itertools
import random

import pytest

from capi_gpu.gpu import catalog, layout, packing
from capi_gpu.gpu.packing import Request

MODEL = catalog.builtin_catalog()["rtx-pro-6000"]


def options(cost_whole: float = 1.0) -> list[packing.NodeOption]:
    return [
        packing.mig_option(MODEL, "all-1g", "1g.24gb=4", 1.0),
        packing.mig_option(MODEL, "all-2g", "2g.48gb=2", 1.0),
        packing.mig_option(MODEL, "balanced", "1g.24gb=2,2g.48gb=1", 1.0),
        packing.whole_gpu_option(MODEL, cost_whole),
    ]


def test_small_mixed_demand() -> None:
    demand = [Request.exact("1g.24gb", 5), Request.exact("2g.48gb", 3), Request.whole_gpu()]
    plan = packing.plan(MODEL, demand, options())
    assert plan.optimal
    assert plan.node_count == 4 == packing.slice_lower_bound_nodes(MODEL, demand)  # 5 + 6 + 4 = 15 slices
    assert plan.lower_bound == plan.cost == 4.0
    served = {(alts, p): n for alts, p, n in plan.assignment}
    assert served == {(("1g.24gb",), "1g.24gb"): 5, (("2g.48gb",), "2g.48gb"): 3, (("gpu",), "gpu"): 1}


def test_first_available_prefers_the_first_alternative_when_capacity_allows() -> None:
    demand = [Request.first_available("2g.48gb", "1g.24gb", count=2), Request.exact("1g.24gb", 2)]
    plan = packing.plan(MODEL, demand, [packing.mig_option(MODEL, "balanced", "1g.24gb=2,2g.48gb=1", 1.0)])
    assert plan.nodes == (("balanced", 2),)
    assert (("2g.48gb", "1g.24gb"), "2g.48gb", 2) in plan.assignment


def test_first_available_falls_back_to_fill_slack() -> None:
    # Two 1g-only nodes cost less than a 2g node when only one 2g-capable pool is expensive.
    opts = [
        packing.mig_option(MODEL, "all-1g", "1g.24gb=4", 1.0),
        packing.mig_option(MODEL, "all-2g", "2g.48gb=2", 3.0),
    ]
    plan = packing.plan(MODEL, [Request.first_available("2g.48gb", "1g.24gb", count=3)], opts)
    assert plan.nodes == (("all-1g", 1),)
    assert plan.assignment == ((("2g.48gb", "1g.24gb"), "1g.24gb", 3),)


def test_costs_steer_the_choice() -> None:
    demand = [Request.exact("1g.24gb", 2), Request.exact("2g.48gb", 1)]
    cheap_balanced = [
        packing.mig_option(MODEL, "all-1g", "1g.24gb=4", 1.0),
        packing.mig_option(MODEL, "all-2g", "2g.48gb=2", 1.0),
        packing.mig_option(MODEL, "balanced", "1g.24gb=2,2g.48gb=1", 1.5),
    ]
    assert packing.plan(MODEL, demand, cheap_balanced).nodes == (("balanced", 1),)
    cheap_balanced[2] = packing.mig_option(MODEL, "balanced", "1g.24gb=2,2g.48gb=1", 2.5)
    assert sorted(packing.plan(MODEL, demand, cheap_balanced).nodes) == [("all-1g", 1), ("all-2g", 1)]


def test_empty_demand_needs_no_nodes() -> None:
    plan = packing.plan(MODEL, [], options())
    assert (plan.nodes, plan.cost, plan.optimal) == ((), 0.0, True)


def test_unservable_demand_is_named() -> None:
    with pytest.raises(packing.PackingError, match=r"no node option serves: 4g\.96gb"):
        packing.plan(MODEL, [Request.exact("4g.96gb"), Request.exact("1g.24gb")], options())


def test_node_options_are_validated() -> None:
    with pytest.raises(layout.LayoutError):
        packing.mig_option(MODEL, "bad", "2g.48gb=1,1g.24gb=3", 1.0)


def test_search_budget_exhausted_reports_a_gap_not_a_false_optimum() -> None:
    rng = random.Random(0)
    opts = [
        packing.mig_option(MODEL, "all-1g", "1g.24gb=4", rng.choice([1.0, 1.3])),
        packing.mig_option(MODEL, "all-2g", "2g.48gb=2", rng.choice([1.0, 1.7])),
        packing.mig_option(MODEL, "balanced", "1g.24gb=2,2g.48gb=1", rng.choice([1.1, 1.4])),
        packing.mig_option(MODEL, "all-4g", "4g.96gb=1", 0.9),
        packing.whole_gpu_option(MODEL, 1.2),
    ]
    alternatives = [("1g.24gb",), ("2g.48gb",), ("2g.48gb", "1g.24gb"), ("4g.96gb", "gpu")]
    demand = [Request(rng.choice(alternatives), 1) for _ in range(40)]
    cut = packing.plan(MODEL, demand, opts, max_explored=3)
    exact = packing.plan(MODEL, demand, opts)
    assert exact.optimal and exact.lower_bound == exact.cost
    assert not cut.optimal
    assert cut.lower_bound <= exact.cost < cut.cost  # the greedy incumbent is beaten by the full search


def _brute_force(demand: list[Request], opts: list[packing.NodeOption]) -> float:
    prob = packing._Problem(MODEL, demand, opts)
    upper = [prob.upper(i) for i in range(len(prob.options))]
    return min(prob.cost(c) for c in itertools.product(*(range(u + 1) for u in upper)) if prob.feasible(list(c)))


LAYOUTS = [
    ("all-1g", "1g.24gb=4"),
    ("all-2g", "2g.48gb=2"),
    ("all-4g", "4g.96gb=1"),
    ("balanced", "1g.24gb=2,2g.48gb=1"),
    ("media", "1g.24gb+me.all=1,1g.24gb-me=3"),
    ("gfx", "1g.24gb+gfx=2,2g.48gb=1"),
]


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force_on_random_instances(seed: int) -> None:
    rng = random.Random(seed)
    opts = [packing.mig_option(MODEL, n, s, rng.choice([0.8, 1.0, 1.2, 1.5, 2.0])) for n, s in rng.sample(LAYOUTS, 3)]
    if rng.random() < 0.5:
        opts.append(packing.whole_gpu_option(MODEL, rng.choice([1.0, 1.3])))
    offered = sorted({p for o in opts for p, _ in o.devices})
    demand = [
        Request(tuple(rng.sample(offered, rng.randint(1, min(2, len(offered))))), rng.randint(1, 4))
        for _ in range(rng.randint(1, 5))
    ]
    plan = packing.plan(MODEL, demand, opts)
    assert plan.optimal
    assert plan.cost == pytest.approx(_brute_force(demand, opts))
    covered = sum(n for _, _, n in plan.assignment)
    assert covered == sum(r.count for r in demand)
    supply: dict[str, int] = {}
    for name, count in plan.nodes:
        for p, k in next(o for o in opts if o.name == name).devices:
            supply[p] = supply.get(p, 0) + k * count
    used: dict[str, int] = {}
    for alts, p, n in plan.assignment:
        assert p in alts
        used[p] = used.get(p, 0) + n
    assert all(used[p] <= supply[p] for p in used)
