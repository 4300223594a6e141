"""`capi-gpu dev up|down`: the whole flow on the embedded default, on this machine.

``up`` builds or reuses the pinned control plane, starts the Robot simulator and simulated GEX131
hosts, runs the operator, applies the dev cluster template, waits until the operator has installed the
cluster's DRA add-ons (NVIDIA's chart, the gate driver, the claim templates: AddonsReady), scales the GPU
MachineDeployment, submits a pod with a 1g.24gb claim and shows the live host view (``capi_gpu.cli.live``:
a table redrawn in place on a terminal, one line per change otherwise) until the pod is bound, then prints
a summary. It stays up (Ctrl-C or ``dev down`` to stop) unless ``--exit``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from capi_gpu.cli import EXIT_FAILED, EXIT_OK, live

STATE = Path(".dev")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dev", help="local management cluster with simulated GEX131 hosts")
    dsub = p.add_subparsers(dest="dev_command", required=True)
    up = dsub.add_parser("up", help="bring everything up and bind a 1g.24gb claim")
    up.add_argument("--hosts", type=int, default=3)
    up.add_argument("--replicas", type=int, default=2)
    up.add_argument("--layout", default="all-balanced", help="mig-parted preset for the GPU workers")
    up.add_argument("--state-dir", type=Path, default=STATE)
    up.add_argument("--exit", action="store_true", help="tear down after the summary (CI)")
    up.add_argument("--timeout", type=float, default=900)
    up.set_defaults(func=cmd_up)
    down = dsub.add_parser("down", help="stop and clean everything dev up started")
    down.add_argument("--state-dir", type=Path, default=STATE)
    down.set_defaults(func=cmd_down)


def cmd_up(args: argparse.Namespace) -> int:
    from capi_gpu_sim import devflow
    from capi_gpu_sim.world import World, WorldConfig

    state = args.state_dir.resolve()
    state.mkdir(parents=True, exist_ok=True)
    (state / "dev.pid").write_text(str(os.getpid()))
    t0 = time.monotonic()
    print(
        f"== building or reusing the pinned control plane, starting Robot sim and {args.hosts} simulated GEX131 hosts",
        flush=True,
    )
    # The operator installs NVIDIA's DRA chart, the gate driver and the claim templates into the dev cluster
    # through its Ansible run, as it does in a user's cluster (the chart from its archive in ../shared/upstream).
    # As a user installs it: clusterctl init of the release (cert-manager, webhook, RBAC, two replicas).
    world = World(
        WorldConfig(state_dir=state, hosts=args.hosts, layout=args.layout, addons=True, release=True, replicas=2)
    )
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        world.start()
        kubeconfig = world.write_user_kubeconfig()  # its context's namespace is the world's (gpu)
        print(
            f"== up in {time.monotonic() - t0:.0f}s (DRA add-ons by the operator's Ansible run: "
            f"{world.addons_seconds or 0:.0f}s); kubeconfig: {kubeconfig}",
            flush=True,
        )
        print(
            f"== scaling {world.config.cluster}-gpu to {args.replicas} and submitting pod mig-demo (1g.24gb)",
            flush=True,
        )
        with live.View(title=f"scale-up of {world.config.cluster}-gpu to {args.replicas}") as view:

            def tick() -> None:
                view.show(live.read(world.k, world.config.namespace))

            summary = devflow.run(world, args.replicas, timeout=args.timeout, tick=tick)
            tick()  # the last frame: where the bound pod's host ended up
        print()
        for line in summary.lines():
            print(line)
        (state / "summary.json").write_text(
            json.dumps(
                {
                    "seconds": summary.seconds,
                    "pod_node": summary.pod_node,
                    "steps": summary.steps,
                    "robot_calls": summary.robot_calls,
                }
            )
        )
        if args.exit:
            return EXIT_OK
        print(
            f"\nEnvironment is up. export KUBECONFIG={kubeconfig} (namespace {world.config.namespace})\n"
            "Ctrl-C or `capi-gpu dev down` stops it."
        )
        while not stop["now"]:
            time.sleep(1)
        return EXIT_OK
    except (TimeoutError, RuntimeError) as exc:
        print(f"dev up failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        world.stop()
        (state / "dev.pid").unlink(missing_ok=True)


def cmd_down(args: argparse.Namespace) -> int:
    from capi_gpu_sim.hosts import registry
    from capi_gpu_sim.procs import reap_strays

    state = args.state_dir.resolve()
    pid_file = state / "dev.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
            for _ in range(120):
                time.sleep(0.5)
                if not pid_file.exists():
                    break
        except ProcessLookupError:
            pid_file.unlink(missing_ok=True)
    reap_strays(state / "controlplane" / "pids")
    registry.cleanup_stale()
    # leftovers() answers every kind, each with a list; nothing is left when every list is empty.
    left = {kind: names for kind, names in registry.leftovers().items() if names}
    print("dev environment stopped" + (f"; leftovers: {left}" if left else ""))
    return EXIT_FAILED if left else EXIT_OK
