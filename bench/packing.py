"""Packing benchmark: the planner against whole-GPU allocation and the slice lower bound.

Why: the claim-aware scaler exists because MIG claims pack several to a GPU; this measures how many
nodes that saves on mixed claim workloads (seeded, so runs are comparable) and how close the planner
gets to the bound no packing can beat, ``ceil(total memory slices / 4)``.

* whole-GPU allocation: one claim = one GPU (what a device-plugin ``nvidia.com/gpu`` request does);
* planner: ``capi_gpu.gpu.packing.plan`` over the node options of a scenario, all at one node price
  (one GEX131 costs the same whatever its layout), so cost = nodes;
* bound: every claim's smallest alternative, in slices, packed perfectly.

Run: ``.venv/bin/python bench/packing.py [--seeds 10] [--sizes 20,50,100,200]``. Prints one JSON line,
then a table.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

from capi_gpu.gpu import catalog, packing

MODEL = catalog.builtin_catalog()["rtx-pro-6000"]
FA = ("2g.48gb", "1g.24gb")  # the shipped prioritized-list template: 2g.48gb, else 1g.24gb

# Claim mixes: (weight, alternatives).
MIXES: dict[str, list[tuple[float, tuple[str, ...]]]] = {
    "inference": [(0.60, ("1g.24gb",)), (0.20, ("2g.48gb",)), (0.15, FA), (0.03, ("4g.96gb",)), (0.02, ("gpu",))],
    "mixed": [(0.35, ("1g.24gb",)), (0.25, ("2g.48gb",)), (0.20, FA), (0.10, ("4g.96gb",)), (0.10, ("gpu",))],
    "training": [(0.10, ("1g.24gb",)), (0.30, ("2g.48gb",)), (0.10, FA), (0.30, ("4g.96gb",)), (0.20, ("gpu",))],
}


def scenarios() -> dict[str, list[packing.NodeOption]]:
    whole = packing.whole_gpu_option(MODEL, 1.0)
    return {
        # every plain preset is a MachineDeployment
        "presets": [
            packing.mig_option(MODEL, "all-1g.24gb", "1g.24gb=4", 1.0),
            packing.mig_option(MODEL, "all-2g.48gb", "2g.48gb=2", 1.0),
            packing.mig_option(MODEL, "all-4g.96gb", "4g.96gb=1", 1.0),
            packing.mig_option(MODEL, "all-balanced", "1g.24gb=2,2g.48gb=1", 1.0),
            whole,
        ],
        # what an operator might actually run: three pools
        "pools": [
            packing.mig_option(MODEL, "all-balanced", "1g.24gb=2,2g.48gb=1", 1.0),
            packing.mig_option(MODEL, "all-1g.24gb", "1g.24gb=4", 1.0),
            packing.mig_option(MODEL, "all-4g.96gb", "4g.96gb=1", 1.0),
            whole,
        ],
    }


def workload(mix: str, size: int, rng: random.Random) -> list[packing.Request]:
    weights = [w for w, _ in MIXES[mix]]
    picks = rng.choices([alts for _, alts in MIXES[mix]], weights=weights, k=size)
    counts: dict[tuple[str, ...], int] = {}
    for alts in picks:
        counts[alts] = counts.get(alts, 0) + 1
    return [packing.Request(alts, n) for alts, n in counts.items()]


def run(seeds: int, sizes: list[int]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for scenario, options in scenarios().items():
        for mix in MIXES:
            for size in sizes:
                planner, bound, whole, millis, optimal = [], [], [], [], 0
                for seed in range(seeds):
                    demand = workload(mix, size, random.Random(f"{mix}/{size}/{seed}"))
                    start = time.perf_counter()
                    result = packing.plan(MODEL, demand, options)
                    millis.append((time.perf_counter() - start) * 1000)
                    planner.append(result.node_count)
                    bound.append(packing.slice_lower_bound_nodes(MODEL, demand))
                    whole.append(sum(r.count for r in demand))
                    optimal += result.optimal
                rows.append(
                    {
                        "scenario": scenario,
                        "mix": mix,
                        "claims": size,
                        "planner_nodes": statistics.mean(planner),
                        "whole_gpu_nodes": statistics.mean(whole),
                        "slice_bound_nodes": statistics.mean(bound),
                        "planner_over_bound": round(sum(planner) / sum(bound), 4),
                        "saving_vs_whole_gpu": round(1 - sum(planner) / sum(whole), 4),
                        "optimal_fraction": optimal / seeds,
                        "ms_mean": round(statistics.mean(millis), 2),
                        "ms_max": round(max(millis), 2),
                    }
                )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--sizes", default="20,50,100,200")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = run(args.seeds, sizes)
    print(json.dumps({"bench": "packing", "gpu": MODEL.key, "seeds": args.seeds, "results": rows}))
    print()
    print(
        f"{'scenario':<9}{'mix':<11}{'claims':>7}{'planner':>9}{'bound':>8}{'whole':>8}{'/bound':>8}{'saved':>8}{'opt':>6}{'ms':>8}"
    )
    for r in rows:
        print(
            f"{r['scenario']!s:<9}{r['mix']!s:<11}{r['claims']!s:>7}{r['planner_nodes']:>9.1f}"
            f"{r['slice_bound_nodes']:>8.1f}{r['whole_gpu_nodes']:>8.1f}{r['planner_over_bound']:>8.3f}"
            f"{r['saving_vs_whole_gpu']:>8.1%}{r['optimal_fraction']:>6.0%}{r['ms_mean']:>8.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
