"""What a node's route would take on a real GEX131: the counts ``scaleup.py`` measures on the simulator
(reboots per node, whether packages were installed, Configure's Ansible run) times per-step real-hardware
seconds, each with its source. docs/node-images.md prints the same table.

Why a model and not a measurement: no GEX131 runs here; the simulator compresses resets and boots and
installs stand-in packages, so only its counts carry over. A step time marked ``estimate`` has no published
figure behind it; ``--step`` (``scaleup.py --step dkms_build=420``) replaces any of them with what a user
measured on their own node.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Step:
    seconds: float
    basis: str  # "measured" (by the source named) or "estimate"
    source: str


STEPS: dict[str, Step] = {
    "reset_to_rescue": Step(
        330.0,
        "measured",
        "hardware reset to reachable rescue SSH, about 5 min 30 s on bare metal: CAPH PR #1946 "
        "(shared/reference/hetzner.md section 4.2, Timings)",
    ),
    "reboot_to_os": Step(
        330.0,
        "estimate",
        "hetzner.md section 4.2: the final reboot is 'comparable to the rescue boot, i.e. several minutes'; "
        "the same firmware POST as the reset above, so the same figure",
    ),
    "installimage_plain": Step(
        180.0,
        "estimate",
        "hetzner.md section 4.2: installimage takes 'a few minutes (size of image plus RAID set-up)', not measured",
    ),
    "installimage_node_image": Step(
        240.0,
        "estimate",
        "the plain install plus unpacking a larger archive (driver, CUDA user space, toolkit, containerd, "
        "kubelet) and its sha256 in rescue; not measured",
    ),
    "packages": Step(
        300.0,
        "estimate",
        "apt update and the install of headers, driver, toolkit, containerd and kubelet from Hetzner's mirror "
        "and NVIDIA's repository; no published figure; the 33 package tasks the simulator counts",
    ),
    "dkms_build": Step(
        300.0,
        "estimate",
        "building the 580 open kernel module for the running kernel with DKMS, and the initramfs after the "
        "nouveau blacklist; no published figure found: measure it on the first node (issue 33 asks for 'a DKMS "
        "build' as a step; verify)",
    ),
    "configure_nothing_to_install": Step(
        60.0,
        "estimate",
        "Configure's Ansible run when every package task is already satisfied (the simulator's run, real Ansible "
        "over SSH against stand-in packages, is the bench's CONFIGURE column; a GEX131's CPU is faster)",
    ),
    "join": Step(
        60.0,
        "estimate",
        "kubeadm join, the DRA driver's pod and its ResourceSlices, the gate lifting the taint; not measured "
        "on hardware",
    ),
}

ROUTES = ("cold-full", "cold-image", "standby")


def with_overrides(overrides: dict[str, float]) -> dict[str, Step]:
    unknown = set(overrides) - set(STEPS)
    if unknown:
        raise ValueError(f"unknown step(s) {sorted(unknown)}; known: {sorted(STEPS)}")
    return {
        k: replace(v, seconds=overrides[k], basis="given", source="--step") if k in overrides else v
        for k, v in STEPS.items()
    }


def route_steps(route: str, reboots: float, packages_changed: bool) -> dict[str, float]:
    """How many of each step a node's route takes, from what the simulator counted for it."""
    if route == "standby":  # prepared up to the join before the claim: only the join is on its path
        return {"join": 1.0}
    image = route == "cold-image"
    counts = {
        "reset_to_rescue": 1.0,
        "installimage_node_image" if image else "installimage_plain": 1.0,
        "reboot_to_os": reboots,
        "join": 1.0,
    }
    if packages_changed:
        counts.update(packages=1.0, dkms_build=1.0)
    else:
        counts["configure_nothing_to_install"] = 1.0
    return counts


def estimate(
    route: str, reboots: float, packages_changed: bool, steps: dict[str, Step] | None = None
) -> dict[str, Any]:
    table = steps or STEPS
    counts = route_steps(route, reboots, packages_changed)
    seconds = sum(table[k].seconds * n for k, n in counts.items())
    return {
        "route": route,
        "steps": counts,
        "minutes": round(seconds / 60, 1),
        "estimated_part_pct": round(
            100 * sum(table[k].seconds * n for k, n in counts.items() if table[k].basis == "estimate") / seconds
        ),
    }


def sources(steps: dict[str, Step] | None = None) -> list[str]:
    return [f"{k}: {v.seconds:.0f} s ({v.basis}) - {v.source}" for k, v in (steps or STEPS).items()]
