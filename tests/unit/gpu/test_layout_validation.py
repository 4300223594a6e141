"""Layouts: parse forms, counts, slice/compute/engine budgets, placement search, messages, nearest valid layouts."""

from __future__ import annotations

import pytest

from capi_gpu.gpu import catalog, layout


@pytest.mark.parametrize(
    "spec",
    ["1g.24gb=2,2g.48gb=1", " 2g.48gb=1 , 1g.24gb=2 ", "1g.24gb:2,2g.48gb:1", "MIG 1G.24GB=2,2g.48gb=1,4g.96gb=0"],
)
def test_string_forms_normalise_to_one_layout(spec: str) -> None:
    assert layout.parse_layout(spec) == layout.parse_layout({"1g.24gb": 2, "2g.48gb": 1})
    assert str(layout.parse_layout(spec)) == "1g.24gb=2,2g.48gb=1"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("1g.24gb", "is not '<profile>=<count>'"),
        ("1g.24gb=two", "non-negative integer"),
        ("1g.24gb=-1", "non-negative integer"),
        ("1g.24gb=1,1g.24gb=2", "listed twice"),
        ("gpu=1", "not a MIG GPU-instance profile name"),
    ],
)
def test_unparseable_layouts(spec: str, message: str) -> None:
    with pytest.raises(layout.LayoutError, match=message):
        layout.parse_layout(spec)


def test_mapping_with_a_non_integer_count_is_rejected() -> None:
    with pytest.raises(layout.LayoutError, match="non-negative integer"):
        layout.parse_layout({"1g.24gb": True})


VALID_RTX = [
    "1g.24gb=4",
    "2g.48gb=2",
    "4g.96gb=1",
    "1g.24gb=2,2g.48gb=1",
    "1g.24gb+me=1,1g.24gb=3",
    "1g.24gb+me.all=1,1g.24gb-me=3",
    "2g.48gb+me.all=1,2g.48gb-me=1",
    "1g.24gb+gfx=2,2g.48gb+gfx=1",
    "1g.24gb=1",
]


@pytest.mark.parametrize("spec", VALID_RTX)
def test_valid_rtx_layouts(rtx: catalog.GpuModel, spec: str) -> None:
    placed = layout.validate(rtx, spec)
    assert len(placed) == layout.parse_layout(spec).instances
    used = [u for inst in placed for u in range(inst.start, inst.start + inst.size)]
    assert len(used) == len(set(used)), "instances overlap"
    for inst in placed:
        assert inst.start in rtx.profile(inst.profile).placement_starts


INVALID_RTX = [
    # spec, culprit profile, fragments the message must contain
    (
        "2g.48gb=1,1g.24gb=3",
        "2g.48gb",
        ["needs 5 memory slices", "the GPU has 4", "2g.48gb=1 takes 2", "1g.24gb=3 takes 3"],
    ),
    ("1g.24gb=5", "1g.24gb", ["1g.24gb: 5 instances requested, at most 4 fit"]),
    ("2g.48gb=3", "2g.48gb", ["at most 2 fit", "needs 6 memory slices"]),
    ("4g.96gb=1,1g.24gb=1", "4g.96gb", ["needs 5 memory slices"]),
    ("1g.24gb+me=2", "1g.24gb+me", ["at most 1 fit"]),
    ("1g.24gb+me.all=1,1g.24gb=1", "1g.24gb+me.all", ["NVDEC", "1g.24gb+me.all takes all media engines"]),
    ("1g.24gb+me=1,2g.48gb+me.all=1", "2g.48gb+me.all", ["OFA"]),
]


@pytest.mark.parametrize(("spec", "culprit", "fragments"), INVALID_RTX)
def test_invalid_rtx_layouts_explain_themselves(
    rtx: catalog.GpuModel, spec: str, culprit: str, fragments: list[str]
) -> None:
    with pytest.raises(layout.LayoutError) as info:
        layout.validate(rtx, spec)
    err = info.value
    message = str(err)
    assert err.profile == culprit
    assert err.budget == 4
    assert "(4 memory slices)" in message
    for fragment in fragments:
        assert fragment in message
    assert err.suggestions, "an invalid layout must come with valid alternatives"
    assert all(layout.is_valid(rtx, s) for s in err.suggestions)
    assert "Nearest valid layouts: " + " | ".join(map(str, err.suggestions)) in message


@pytest.mark.parametrize(
    ("spec", "first_suggestion"),
    [
        ("2g.48gb=1,1g.24gb=3", "1g.24gb=2,2g.48gb=1"),  # drop one 1g, keep the 2g
        ("4g.96gb=1,1g.24gb=1", "4g.96gb=1"),
        ("1g.24gb=5", "1g.24gb=4"),
        ("1g.24gb+me.all=1,1g.24gb=1", "1g.24gb=2"),
        ("1g.24gb+me=2", "1g.24gb=1,1g.24gb+me=1"),
    ],
)
def test_nearest_valid_layout_ordering(rtx: catalog.GpuModel, spec: str, first_suggestion: str) -> None:
    with pytest.raises(layout.LayoutError) as info:
        layout.validate(rtx, spec)
    assert str(info.value.suggestions[0]) == first_suggestion


def test_engine_conflict_suggests_the_no_media_variant(rtx: catalog.GpuModel) -> None:
    with pytest.raises(layout.LayoutError) as info:
        layout.validate(rtx, "1g.24gb+me.all=1,1g.24gb=1")
    assert "1g.24gb+me.all=1,1g.24gb-me=1" in map(str, info.value.suggestions)


def test_a_profile_of_another_model_is_named_with_the_known_ones(rtx: catalog.GpuModel) -> None:
    with pytest.raises(layout.LayoutError, match=r"rtx-pro-6000 has no MIG profile 7g.80gb \(known: 1g.24gb,") as info:
        layout.validate(rtx, "7g.80gb=1")
    assert info.value.profile == "7g.80gb"
    assert info.value.suggestions == ()


def test_unknown_profile_suggests_dropping_it(rtx: catalog.GpuModel) -> None:
    with pytest.raises(layout.LayoutError) as info:
        layout.validate(rtx, "1g.24gb=2,3g.72gb=1")
    assert [str(s) for s in info.value.suggestions] == ["1g.24gb=2"]


HOPPER = [
    ("1g.10gb=7", True),
    ("4g.40gb=1,3g.40gb=1", True),
    ("1g.10gb=2,2g.20gb=1,3g.40gb=1", True),
    ("2g.20gb=3,1g.20gb=1", True),
    ("1g.10gb+me=1,1g.10gb=6", True),
    ("3g.40gb=2,1g.10gb=1", False),  # memory
    ("4g.40gb=1,2g.20gb=2", False),  # compute: 4 + 2 + 2 > 7
    ("1g.10gb=8", False),
    ("1g.20gb=4,1g.10gb=1", False),
]


@pytest.mark.parametrize(("spec", "ok"), HOPPER)
def test_h100_layouts(h100: catalog.GpuModel, spec: str, ok: bool) -> None:
    assert layout.is_valid(h100, layout.parse_layout(spec)) is ok


def test_h100_compute_budget_message(h100: catalog.GpuModel) -> None:
    with pytest.raises(layout.LayoutError, match="needs 8 compute slices, the GPU has 7"):
        layout.validate(h100, "4g.40gb=1,2g.20gb=2")


def test_placement_follows_mig_parted_order_and_lowest_free_start(rtx: catalog.GpuModel) -> None:
    # mig-parted creates the 2g first; the driver then takes the lowest free placements, exactly as in
    # the published `-cgi 2g.48gb,1g.24gb,1g.24gb -C` / `-lgi` output (2g at 0:6, 1g at 6:3 and 9:3).
    assert layout.place(rtx, "1g.24gb=2,2g.48gb=1") == (
        layout.PlacedInstance("2g.48gb", 5, 0, 6),
        layout.PlacedInstance("1g.24gb", 14, 6, 3),
        layout.PlacedInstance("1g.24gb", 14, 9, 3),
    )


def test_placement_backtracks_when_first_fit_fails(h100: catalog.GpuModel) -> None:
    # 3g.40gb at 0 leaves no slot for the second 1g.10gb (1g cannot start at 7): it must go to 4.
    placed = layout.place(h100, "1g.10gb=2,2g.20gb=1,3g.40gb=1")
    assert [(i.profile, i.start) for i in placed] == [("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)]


def test_placement_is_deterministic(rtx: catalog.GpuModel) -> None:
    first = layout.place(rtx, "1g.24gb-me=3,1g.24gb+me.all=1")
    assert all(layout.place(rtx, "1g.24gb+me.all=1,1g.24gb-me=3") == first for _ in range(3))
