"""The cold-from-image route of ``scaleup.py --image``: the bake of a prepared standby, and the three routes
(cold-full, cold-image, standby) side by side with their real-hardware estimate (``hardware_model``)."""

from __future__ import annotations

import re
import time
from typing import Any

import hardware_model

from capi_gpu_sim import devflow
from capi_gpu_sim.world import World


def bake(world: World, host: str) -> tuple[dict[str, str], float]:
    """``capi-gpu image bake`` of a prepared standby, as a user runs it, into the world's image directory
    (what its rescue systems see); returns spec.image and the bake's seconds."""
    out, started = world.images_dir / f"{host}.tar.gz", time.monotonic()
    done = devflow.bake_cli(world, host, out)
    sha = re.search(r"sha256: ([0-9a-f]{64})", done.stdout)
    if done.returncode != 0 or sha is None:
        raise SystemExit(f"capi-gpu image bake {host} failed: {done.stderr[-2000:]}")
    assert world.fleet is not None
    return {"url": world.fleet.image_url(out.name), "sha256": sha.group(1)}, time.monotonic() - started


def routes(
    steps: dict[str, hardware_model.Step],
    cold: dict[str, Any] | None,
    standby: dict[str, Any] | None,
    image: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """Cold-full, cold-from-image and standby side by side: the simulator's counts per node and the
    real-hardware minutes bench/hardware_model.py makes of them."""
    out = []
    for name, r in (("cold-full", cold), ("cold-image", image), ("standby", standby)):
        if not r or not r.get("ready"):
            continue
        packages = r["package_tasks_changed_per_node"] > 0
        out.append(
            {
                "route": name,
                "reboots_per_node": r["reboots_per_node"],
                "changed_tasks_per_node": r["changed_tasks_per_node"],
                "package_tasks_changed_per_node": r["package_tasks_changed_per_node"],
                "configure_s": r["ansible_s"],
                "claim_bound_s": r["time_to_claim_bound_s"]["mean"],
                "real_hardware": hardware_model.estimate(name, r["reboots_per_node"], packages, steps),
            }
        )
    return out
