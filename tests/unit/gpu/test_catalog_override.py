"""Catalog override: replacing fields of a built-in model, adding a model, rejecting malformed documents."""

from __future__ import annotations

import pytest

from capi_gpu.gpu import catalog, layout


def test_override_replaces_only_the_given_fields() -> None:
    cat = catalog.load_override("models:\n  rtx-pro-6000:\n    deviceIds: ['0x2BB5', '0x2BB4']\n")
    model = cat["rtx-pro-6000"]
    assert model.device_ids == (0x2BB5, 0x2BB4)
    assert model.profile("1g.24gb").gi_profile_id == 14
    assert catalog.builtin_catalog()["rtx-pro-6000"].device_ids == (0x2BB5,)


NEW_MODEL = """
models:
  toy-4:
    productName: Toy GPU
    architecture: Test
    deviceIds: [0x1234]
    memorySlices: 4
    computeSlices: 4
    placementUnits: 4
    minDriver: {branch: R1, minimum: "1.0"}
    engines: {decoders: 1, copyEngines: 4}
    profiles:
      - {name: 2g.2gb, id: 1, maxInstances: 2, placements: [0, 2], placementSize: 2}
      - {name: 1g.1gb, id: 2, maxInstances: 2, placements: [1, 2], placementSize: 1}
"""


def test_new_model_from_override_and_placement_only_infeasibility() -> None:
    model = catalog.load_override(NEW_MODEL).model("0x123410DE")
    assert model.key == "toy-4"
    assert model.profile("1g.1gb").memory_slices == 1
    # Budgets allow 2 + 1 + 1 slices, but wherever the 2-slice instance goes it blocks a 1g start.
    with pytest.raises(layout.LayoutError, match=r"no arrangement of the allowed placements fits the 4-unit grid"):
        layout.validate(model, "2g.2gb=1,1g.1gb=2")
    assert layout.place(model, "2g.2gb=1,1g.1gb=1") == (
        layout.PlacedInstance("2g.2gb", 1, 0, 2),
        layout.PlacedInstance("1g.1gb", 2, 2, 1),
    )


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("models: [1]", "'models' mapping"),
        ("models:\n  rtx-pro-6000:\n    colour: red\n", "unknown field"),
        ("models:\n  rtx-pro-6000:\n    memorySlices: four\n", "memorySlices: expected an integer"),
        ("models:\n  rtx-pro-6000:\n    placementUnits: 10\n", "do not divide"),
        ("models:\n  new-one:\n    productName: X\n", "a new model needs"),
        ("models: {a: [", "not valid YAML"),
    ],
)
def test_malformed_overrides_name_the_problem(doc: str, message: str) -> None:
    with pytest.raises(catalog.CatalogError, match=message):
        catalog.load_override(doc)
