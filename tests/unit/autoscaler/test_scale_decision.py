"""Scale decision: free and coming devices first, only owned groups grow, fewest nodes then cost, max as a
hard bound (cut, replan, greedy), never lower, min as a floor on a scale-up, firstAvailable order,
unserved reasons, and the maximum matching."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from capi_gpu.autoscaler.decide import Group, ScaleUp, Shortfall, decide, match
from capi_gpu.gpu import catalog
from capi_gpu.gpu.packing import WHOLE_GPU, Request

MODEL = catalog.builtin_catalog()["rtx-pro-6000"]
BALANCED = (("1g.24gb", 2), ("2g.48gb", 1))
ALL_2G = (("2g.48gb", 2),)
ALL_1G = (("1g.24gb", 4),)
WHOLE = ((WHOLE_GPU, 1),)


def group(
    name: str,
    devices: tuple[tuple[str, int], ...],
    replicas: int = 0,
    lo: int = 0,
    hi: int = 3,
    *,
    owned: bool = True,
    cost: float | None = None,
    coming: int = 0,
) -> Group:
    return Group(name, MODEL, devices, replicas, lo, hi, owned, cost, coming)


@dataclass
class Case:
    name: str
    demand: list[Request]
    groups: list[Group]
    want: dict[str, tuple[int, int]]  # group -> (current, target)
    free: dict[str, int] = field(default_factory=dict)
    unserved: dict[tuple[str, ...], tuple[int, Shortfall]] = field(default_factory=dict)
    covered: int = 0


CASES = [
    Case(
        "one 2g claim, zero nodes: the owned group goes 0->1",
        [Request.exact("2g.48gb")],
        [group("gpu", BALANCED)],
        {"gpu": (0, 1)},
    ),
    Case(
        "a free 2g device on an existing node covers it",
        [Request.exact("2g.48gb")],
        [group("gpu", BALANCED, replicas=1)],
        {},
        free={"2g.48gb": 1},
        covered=1,
    ),
    Case(
        "a coming node (replica without slices) covers it: no second node while the first installs",
        [Request.exact("2g.48gb")],
        [group("gpu", BALANCED, replicas=1, coming=1)],
        {},
        covered=1,
    ),
    Case(
        "a node cluster-autoscaler is adding covers it too",
        [Request.exact("2g.48gb")],
        [group("ca", ALL_2G, 1, owned=False, coming=1), group("gpu", BALANCED)],
        {},
        covered=1,
    ),
    Case(
        "a group owned by cluster-autoscaler never grows",
        [Request.exact("2g.48gb")],
        [group("ca", ALL_2G, owned=False)],
        {},
        unserved={("2g.48gb",): (1, Shortfall.OWNED_BY_CLUSTER_AUTOSCALER)},
    ),
    Case(
        "no layout offers the profile",
        [Request.exact("4g.96gb")],
        [group("gpu", BALANCED)],
        {},
        unserved={("4g.96gb",): (1, Shortfall.NOT_OFFERED)},
    ),
    Case(
        "fewest nodes wins over cost: 4x 2g is two all-2g nodes, not four balanced ones",
        [Request.exact("2g.48gb", 4)],
        [group("bal", BALANCED, hi=5, cost=0.1), group("two", ALL_2G, cost=9.0)],
        {"two": (0, 2)},
    ),
    Case(
        "equal node counts: the lower cost annotation wins",
        [Request.exact("2g.48gb")],
        [group("a", BALANCED, cost=2.0), group("b", ALL_2G, cost=1.5)],
        {"b": (0, 1)},
    ),
    Case(
        "a group without a cost ranks above every priced group",
        [Request.exact("2g.48gb")],
        [group("a", BALANCED), group("b", ALL_2G, cost=100.0)],
        {"b": (0, 1)},
    ),
    Case(
        "max is respected: the rest is planned on the next group",
        [Request.exact("2g.48gb", 5)],
        [group("bal", BALANCED, hi=3), group("two", ALL_2G, hi=1)],
        {"two": (0, 1), "bal": (0, 3)},
    ),
    Case(
        "at max: nothing added, the shortfall is reported",
        [Request.exact("2g.48gb", 3)],
        [group("two", ALL_2G, replicas=1, hi=1)],
        {},
        unserved={("2g.48gb",): (3, Shortfall.AT_MAX_SIZE)},
    ),
    Case(
        "headroom used up: as much as fits, the rest reported",
        [Request.exact("2g.48gb", 5)],
        [group("two", ALL_2G, replicas=1, hi=2)],
        {"two": (1, 2)},
        unserved={("2g.48gb",): (3, Shortfall.AT_MAX_SIZE)},
    ),
    Case(
        "firstAvailable: the 1g fallback on an all-1g node is one node where 2g would need two",
        [Request.first_available("2g.48gb", "1g.24gb", count=3)],
        [group("two", ALL_2G), group("one", ALL_1G)],
        {"one": (0, 1)},
    ),
    Case(
        "firstAvailable: a free fallback device is used before any node is added",
        [Request.first_available("2g.48gb", "1g.24gb")],
        [group("two", ALL_2G)],
        {},
        free={"1g.24gb": 1},
        covered=1,
    ),
    Case(
        "whole GPU claims only fit a MIG-off group",
        [Request.whole_gpu(2)],
        [group("gpu", BALANCED), group("whole", WHOLE)],
        {"whole": (0, 2)},
    ),
    Case(
        "min is a floor when scaling up",
        [Request.exact("2g.48gb")],
        [group("gpu", BALANCED, replicas=0, lo=2)],
        {"gpu": (0, 2)},
    ),
    Case(
        "below min with no demand: left alone (min is CA's or a human's)",
        [Request.exact("2g.48gb")],
        [group("gpu", BALANCED, replicas=1, lo=3, coming=1)],
        {},
        covered=1,
    ),
    Case(
        "replicas above max (set by hand): never lowered, never raised",
        [Request.exact("2g.48gb")],
        [group("gpu", BALANCED, replicas=5, hi=3)],
        {},
        unserved={("2g.48gb",): (1, Shortfall.AT_MAX_SIZE)},
    ),
    Case(
        "mixed demand over two owned groups",
        [Request.exact("1g.24gb", 2), Request.exact("2g.48gb", 3)],
        [group("bal", BALANCED), group("two", ALL_2G)],
        {"bal": (0, 1), "two": (0, 1)},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decision_table(case: Case) -> None:
    decision = decide(case.demand, case.free, case.groups)
    assert {u.group: (u.current, u.target) for u in decision.scale_ups} == case.want
    assert {u.alternatives: (u.count, u.why) for u in decision.unserved} == case.unserved
    assert decision.covered == case.covered
    for up in decision.scale_ups:
        assert up.target > up.current, "a decision never lowers"


def test_scale_up_message_names_what_is_pending() -> None:
    decision = decide([Request.exact("2g.48gb")], {}, [group("gpu", BALANCED)])
    assert decision.scale_ups == (ScaleUp("gpu", 0, 1, (("2g.48gb", 1),)),)
    assert decision.scale_ups[0].message() == "0->1 for 1x 2g.48gb pending"


def test_attribution_splits_claims_between_the_groups_that_grow() -> None:
    decision = decide(
        [Request.exact("1g.24gb", 2), Request.exact("2g.48gb", 3)], {}, [group("bal", BALANCED), group("two", ALL_2G)]
    )
    serves = {u.group: dict(u.serves) for u in decision.scale_ups}
    assert sum(n for s in serves.values() for n in s.values()) == 5
    assert serves["bal"].get("1g.24gb") == 2


def test_other_gpu_models_plan_separately() -> None:
    h100 = catalog.builtin_catalog()["h100-80gb"]
    small = h100.profiles[0].name
    groups = [group("rtx", BALANCED), Group("h100", h100, ((small, 7),), 0, 0, 2, True)]
    decision = decide([Request.exact("2g.48gb"), Request.exact(small)], {}, groups)
    assert {u.group: u.target for u in decision.scale_ups} == {"rtx": 1, "h100": 1}


def test_matching_leaves_the_only_2g_to_the_claim_that_has_no_other_choice() -> None:
    # Listed first, the firstAvailable claim would take the only 2g; the exact 2g claim needs it more.
    served, rest = match(
        [Request.first_available("2g.48gb", "1g.24gb"), Request.exact("2g.48gb")], {"2g.48gb": 1, "1g.24gb": 1}
    )
    assert served == {"2g.48gb": 1, "1g.24gb": 1}
    assert rest == []


def test_matching_prefers_first_alternatives_when_nothing_competes() -> None:
    served, rest = match([Request.first_available("2g.48gb", "1g.24gb", count=2)], {"2g.48gb": 1, "1g.24gb": 5})
    assert served == {"2g.48gb": 1, "1g.24gb": 1}
    assert rest == []


def test_matching_is_maximum_on_a_chain() -> None:
    # a: x|y, b: y|z, c: x -- greedy in order gives a=x, b=y, c stuck; the maximum serves all three.
    demand = [Request(("p1", "p2")), Request(("p2", "p3")), Request(("p1",))]
    served, rest = match(demand, {"p1": 1, "p2": 1, "p3": 1})
    assert sum(served.values()) == 3 and rest == []


def test_unmatched_keeps_the_original_alternatives() -> None:
    _, rest = match([Request.first_available("2g.48gb", "1g.24gb", count=3)], {"1g.24gb": 1})
    assert rest == [Request(("2g.48gb", "1g.24gb"), 2)]
