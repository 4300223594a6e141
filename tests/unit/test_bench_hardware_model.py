"""bench/hardware_model.py, the per-step GEX131 model behind ``scaleup.py --image``: which steps each route
counts, that every step names its basis and source, and that a user's own step time replaces ours."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def model() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hardware_model", BENCH / "hardware_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hardware_model"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("route", "reboots", "packages", "steps", "minutes"),
    [
        (
            "cold-full",
            2,
            True,
            {
                "reset_to_rescue": 1,
                "installimage_plain": 1,
                "reboot_to_os": 2,
                "packages": 1,
                "dkms_build": 1,
                "join": 1,
            },
            30.5,
        ),
        (
            "cold-image",
            1,
            False,
            {
                "reset_to_rescue": 1,
                "installimage_node_image": 1,
                "reboot_to_os": 1,
                "configure_nothing_to_install": 1,
                "join": 1,
            },
            17.0,
        ),
        # An image whose packages were not all there (an older bake): the model charges the build again.
        (
            "cold-image",
            1,
            True,
            {
                "reset_to_rescue": 1,
                "installimage_node_image": 1,
                "reboot_to_os": 1,
                "packages": 1,
                "dkms_build": 1,
                "join": 1,
            },
            26.0,
        ),
        ("standby", 0, False, {"join": 1}, 1.0),
    ],
)
def test_each_route_counts_its_steps(
    model: ModuleType, route: str, reboots: int, packages: bool, steps: dict[str, int], minutes: float
) -> None:
    got = model.estimate(route, reboots, packages)
    assert got["steps"] == steps
    assert got["minutes"] == minutes


def test_every_step_has_a_basis_and_a_source_and_one_is_measured(model: ModuleType) -> None:
    for name, step in model.STEPS.items():
        assert step.basis in ("measured", "estimate"), name
        assert len(step.source) > 20, name
    assert model.STEPS["reset_to_rescue"].basis == "measured"
    assert "1946" in model.STEPS["reset_to_rescue"].source


def test_a_users_step_time_replaces_ours_and_an_unknown_step_is_refused(model: ModuleType) -> None:
    steps = model.with_overrides({"dkms_build": 420.0})
    assert steps["dkms_build"].seconds == 420.0 and steps["dkms_build"].basis == "given"
    assert model.estimate("cold-full", 2, True, steps)["minutes"] == 32.5
    with pytest.raises(ValueError, match="unknown step"):
        model.with_overrides({"dkms": 1.0})
