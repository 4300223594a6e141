"""Scale-up on the whole simulated world: controller overhead, Robot calls per node, 403s, cold vs standby.

Why: a GPU node is worth its price only once it takes pods, so what the controller adds to the
hardware's own waits is the figure to keep small (goal <= 2 %), with at most 6 Robot calls per node
and no 403 (Robot's rate limit). Everything real runs (``capi_gpu_sim.world``): control plane, CAPI,
the operator as a subprocess, the Robot simulator, systemd hosts in namespaces, installimage,
Ansible, cloud-init, the readiness gate and kube-scheduler.

Each size gets fresh hosts, inspected before the clock starts (as a pool is), then the GPU
MachineDeployment is raised by that many replicas. The standby phase inspects more fresh hosts,
sets the template's ``spec.standby.size``, waits for them to be prepared, then raises the replicas.
A claim pod per new node (pinned to it) measures time-to-claim-bound. Ready = host Provisioned and
its Node's startup taint lifted by the gate (it takes GPU pods).

Hardware waits on each host's critical path, from the simulator's own records (intervals, merged):

* a Robot reset: from the request (Robot's request log) to sshd answering in the next boot (the
  fleet's boot records; dark for ``reset_seconds / compression``, then the boot);
* a reboot over SSH (into the installed OS, for MIG): from the controller's action returning (its
  log line) to sshd answering in the next boot;
* installimage: its run on the host (the shim's start/end records);
* Ansible: first to last event of the run (ansible-runner's job events), i.e. the host installing
  the driver, toolkit, kubelet; shown both as hardware and as controller work (``ansible_as``);
* bootstrap: from the controller starting cloud-init to the Node registering, then to the host's DRA
  driver publishing its slices.

Controller overhead = time-to-ready - hardware on [scale, ready]: the CAPI objects and the claim,
probes and polls, SSH sessions, API writes, the gate. The hardware waits are time-compressed (Robot,
resets and boots by ``--compression``, the operator's timeouts by ``--timing-scale``), Ansible and
installimage's work are not: the percentages are those of this machine, not of a real GEX131.

Sizes that would not finish within ``--budget`` (estimated from the size already run: its Ansible
time per host over this machine's CPUs) or that need more memory than is free are reported as not
run, with the reason; nothing is extrapolated into a figure.

``--autoscaler ca`` asks the real cluster-autoscaler for the nodes with pending claim pods instead of
raising the replicas (``bench/scaleup_ca.py``); the columns are the same, plus CA's decision time.

Run as root: ``.venv/bin/python bench/scaleup.py [--hosts 1,2] [--standby 1] [--budget 330] [--autoscaler ca]``.
Prints one JSON line and a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import hardware_model
import scaleup_ca
import scaleup_image
from scaleup_trace import Clocks, Trace, analyse, route
from urllib3.exceptions import ProtocolError

from capi_gpu import domain
from capi_gpu.kube import CAPI_MACHINEDEPLOYMENTS, NODES, PODS, RESOURCESLICES, KubeError, Res, ours
from capi_gpu_sim import devflow
from capi_gpu_sim.world import World, WorldConfig

HOSTS = ours("hetznergpuhosts")
MACHINES = ours("hetznergpumachines")
TEMPLATES = ours("hetznergpumachinetemplates")
HOST_MB = 80  # a systemd host idles at ~47 MB; Ansible and the kubelet thread add to it
GOAL_OVERHEAD_PCT, GOAL_ROBOT_CALLS = 2.0, 6


class Observer:
    """Watches (not polls) hosts, nodes, NVIDIA slices and pods: each event with the time it arrived, so
    a transition is timed to the millisecond and the bench adds no list traffic while it measures."""

    WATCHED = (
        ("host", HOSTS, True),
        ("machine", MACHINES, True),
        ("node", NODES, False),
        ("slice", RESOURCESLICES, False),
        ("pod", PODS, True),
    )

    def __init__(self, world: World) -> None:
        self.world, self.stop = world, threading.Event()
        self.events: queue.Queue[tuple[float, str, str, dict[str, Any]]] = queue.Queue()
        self.threads = [
            threading.Thread(target=self._watch, args=(kind, res, namespaced), daemon=True)
            for kind, res, namespaced in self.WATCHED
        ]
        for thread in self.threads:
            thread.start()

    def _watch(self, kind: str, res: Res, namespaced: bool) -> None:
        kube, rv = self.world.cp.kube(), None  # a client each: a watch holds its connection
        ns = self.world.config.namespace if namespaced else None
        try:
            while not self.stop.is_set():
                try:
                    for typ, obj in kube.watch(res, ns, resource_version=rv, timeout_seconds=5, stop=self.stop):
                        if typ == "ERROR":
                            rv = None  # expired: start again from the current state (ADDED events)
                            break
                        rv = obj["metadata"].get("resourceVersion") or rv
                        if typ != "BOOKMARK":
                            self.events.put((time.monotonic(), kind, typ, obj))
                except (KubeError, OSError, ProtocolError):
                    rv = None
                    self.stop.wait(0.2)
        finally:
            kube.close()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=10)


def on_host(world: World, t: Trace, obj: dict[str, Any], at: float, pin_pods: bool) -> None:
    st = obj.get("status") or {}
    label = f"{st.get('state')}/{st.get('step') or '-'}"
    if not t.steps or t.steps[-1][1] != label:
        t.steps.append((at, label))
    if st.get("state") == "Provisioned" and t.provisioned is None:
        t.provisioned = at
    if (ref := obj["spec"].get("consumerRef")) and t.claimed is None:
        t.claimed, t.machine = at, ref["name"]
        if pin_pods and t.pod is None:
            t.pod = pin(world, t.name)


def apply_event(
    world: World, traces: dict[str, Trace], owned: dict[str, float], pin_pods: bool, event: tuple[float, str, str, Any]
) -> None:
    at, kind, typ, obj = event
    if typ == "DELETED":
        return
    name = obj["metadata"]["name"]
    if kind == "machine" and any(o.get("kind") == "Machine" for o in obj["metadata"].get("ownerReferences") or []):
        owned.setdefault(name, at)  # CAPI's part is done: the HetznerGPUMachine exists and has its owner
    elif kind == "host" and (t := traces.get(name)) is not None:
        on_host(world, t, obj, at, pin_pods)
    elif kind == "node" and (t := traces.get(name)) is not None:
        t.node = t.node or at
        if domain.NODE_STARTUP_TAINT not in {x["key"] for x in obj["spec"].get("taints") or []}:
            t.untainted = t.untainted or at
    elif kind == "slice" and obj["spec"].get("driver") == domain.NVIDIA_DRIVER:
        if (t := traces.get(obj["spec"].get("nodeName") or "")) is not None and t.slices is None:
            t.slices = at
    elif kind == "pod":
        t = next((x for x in traces.values() if x.pod == name), None)
        if t is None and (t := traces.get(obj["spec"].get("nodeName") or "")) is not None and t.pod is None:
            t.pod = name  # unpinned (--autoscaler ca): the first pod bound on the host's node counts for it
        if t is not None and t.bound is None and obj["spec"].get("nodeName"):
            t.bound = at


def pin(world: World, host: str) -> str:
    pod = devflow.claim_pod(f"claim-{host}")
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": host}
    world.k.create(PODS, pod, world.config.namespace)
    return str(pod["metadata"]["name"])


def add_hosts(world: World, n: int, timeout: float) -> tuple[list[Trace], float, int]:
    """n fresh hosts, registered and inspected; returns their traces, seconds and Robot calls."""
    assert world.fleet is not None and world.robot is not None
    calls, started = len(world.robot.log), time.monotonic()
    first = max(world.fleet.hosts, default=world.fleet.config.first_server_number - 1) + 1
    for number in range(first, first + n):
        world.fleet.add_host(number)
    world.fleet.attach_workload(world.k)
    world.register_hosts()
    names = {f"gex131-{number}": number for number in range(first, first + n)}
    deadline = time.monotonic() + timeout
    while True:
        states = {h["metadata"]["name"]: (h.get("status") or {}).get("state") for h in world.hosts()}
        if all(states.get(name) == "Available" for name in names):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"hosts not inspected after {timeout:.0f}s: {states}; see {world.config.state_dir}")
        time.sleep(0.5)
    return (
        [Trace(name, number) for name, number in names.items()],
        time.monotonic() - started,
        len(world.robot.log) - calls,
    )


def wait(world: World, observer: Observer, traces: dict[str, Trace], pin_pods: bool, deadline: float) -> bool:
    owned: dict[str, float] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            apply_event(world, traces, owned, pin_pods, observer.events.get(timeout=0.5))
        for t in traces.values():
            if t.ready is None and t.provisioned and t.untainted:  # either may come first
                t.ready = max(t.provisioned, t.untainted)
            if t.machine is not None:
                t.owned = owned.get(t.machine)
        if all(t.ready and t.bound for t in traces.values()):
            return True
        if world.operator is not None and world.operator.poll() is not None:
            raise SystemExit(f"the operator exited; see {world.config.state_dir}")
    return False


def run_phase(
    world: World,
    traces: list[Trace],
    replicas: int,
    pin_now: bool,
    timeout: float,
    ca: bool = False,
    md: str | None = None,
) -> dict[str, Any]:
    assert world.robot is not None and world.fleet is not None
    clocks, calls = Clocks(world), len(world.robot.log)
    boots_before = {t.name: len(world.fleet.hosts[t.number].boots) for t in traces}
    since_wall = time.time()
    by_name = {t.name: t for t in traces}
    observer = Observer(world)
    decision: float | None = None
    try:
        time.sleep(1.0)  # the watches are open (their first events are the current state)
        t0 = time.monotonic()
        if ca:  # pending pods, and CA raises the replicas (the events queue meanwhile, with their times)
            scaleup_ca.demand(world, len(traces), str(replicas))
            decision = scaleup_ca.decision_s(world, replicas - len(traces), t0, timeout)
        else:
            world.scale(replicas, md)
        if pin_now:
            for t in traces:
                t.pod = pin(world, t.name)
        finished = wait(world, observer, by_name, not pin_now and not ca, t0 + timeout)
    finally:
        observer.close()
    result = analyse(world, traces, t0, clocks)
    result["hosts"], result["completed"] = len(traces), finished
    result.update(route(world, traces, since_wall, boots_before))
    result["errors"] = host_errors(world, by_name)
    result["robot_calls"] = len(world.robot.log) - calls
    result["wall_s"] = round(time.monotonic() - t0, 1)
    if ca:
        result["ca_decision_s"] = decision
        result["ca_replicas"] = scaleup_ca.replicas(world)
    return result


def host_errors(world: World, names: dict[str, Trace]) -> dict[str, Any]:
    """The last error each traced host recorded, also one it recovered from (a size that did not finish
    says why, not only "none ready")."""
    types: dict[str, int] = {}
    last: dict[str, str] = {}
    for h in world.hosts():
        status = h.get("status") or {}
        if h["metadata"]["name"] not in names or not status.get("errorType"):
            continue
        kind = str(status["errorType"]) + (" (permanent)" if status.get("errorPermanent") else "")
        types[kind] = types.get(kind, 0) + 1
        last[kind] = str(status.get("errorMessage") or "")[:200]
    return {"by_type": types, "last_message": last}


def mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def skip_reason(n: int, done: list[dict[str, Any]], left: float, reserve: bool) -> str | None:
    """Why size n is not run here, or None. The estimate uses only what the last size run measured:
    its non-Ansible time, plus n Ansible runs of its length sharing this machine's CPUs; ``reserve``
    keeps one more such run for the standby phase."""
    need = n * HOST_MB
    if need > 0.7 * mem_available_mb():
        return f"needs ~{need} MB for {n} simulated hosts, {mem_available_mb():.0f} MB available"
    ran = [d for d in done if d.get("ready")]
    if not ran:
        return None
    last, cores = ran[-1], os.cpu_count() or 1
    ttr, ansible = last["time_to_ready_s"]["max"], last["ansible_s"]
    estimate = ttr - ansible + max(ansible, n * ansible / cores) + last["inspect_s"]
    standby = ttr + 15.0 if reserve else 0.0
    if estimate + standby > left:
        return (
            f"estimated >= {estimate:.0f} s ({n} Ansible runs of ~{ansible:.0f} s on {cores} CPUs)"
            + (f" + {standby:.0f} s for the standby phase" if reserve else "")
            + f", {left:.0f} s of --budget left"
        )
    return None


def image_phase(world: World, size: int, image: dict[str, str], timeout: float) -> dict[str, Any]:
    """``size`` fresh hosts, a MachineDeployment whose template names ``image``, raised to ``size``."""
    traces, inspect_s, inspect_calls = add_hosts(world, size, timeout)
    md = devflow.image_deployment(world, f"{world.config.cluster}-gpu-image", image)
    result = run_phase(world, traces, size, True, timeout, md=md)
    result.update(inspect_s=round(inspect_s, 1), inspect_robot_calls=inspect_calls)
    return result


def standby_phase(world: World, size: int, timeout: float, image: dict[str, Any] | None = None) -> dict[str, Any]:
    """The template's standby pool of ``size`` fresh hosts, prepared, then claimed. ``image``: a dict that
    gets the first standby's bake (spec.image) and its seconds, taken before the claim."""
    traces, inspect_s, inspect_calls = add_hosts(world, size, timeout)
    names = {t.name for t in traces}
    started = time.monotonic()
    template = f"{world.config.cluster}-gpu"
    world.k.patch(TEMPLATES, template, {"spec": {"standby": {"size": size}}}, world.config.namespace)
    deadline = started + timeout
    while (
        sum(
            1
            for h in world.hosts()
            if h["metadata"]["name"] in names and (h.get("status") or {}).get("state") == "Standby"
        )
        < size
    ):
        if time.monotonic() > deadline:
            raise SystemExit(f"standby pool not prepared after {timeout:.0f}s; see {world.config.state_dir}")
        time.sleep(0.5)
    prepared_s = time.monotonic() - started
    if image is not None:
        spec, seconds = scaleup_image.bake(world, traces[0].name)
        image.update(spec=spec, bake_s=round(seconds, 1))
    md = world.k.get(CAPI_MACHINEDEPLOYMENTS, template, world.config.namespace)
    result = run_phase(world, traces, int(md["spec"].get("replicas") or 0) + size, True, timeout)
    result.update(
        standby_prepare_s=round(prepared_s, 1), inspect_s=round(inspect_s, 1), inspect_robot_calls=inspect_calls
    )
    return result


def measure(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    started = time.monotonic()
    config = WorldConfig(
        state_dir=state, hosts=0, compression=args.compression, timing_scale=args.timing_scale, release=False
    )
    if args.ansible_parallel:
        config.operator_args.extend(["--ansible-parallel", str(args.ansible_parallel)])
    world = World(config)
    sizes: list[dict[str, Any]] = []
    standby: dict[str, Any] | None = None
    image: dict[str, Any] | None = None
    autoscaler = None
    try:
        world.start()
        assert world.robot is not None
        replicas = 0
        if args.autoscaler == "ca":
            autoscaler = scaleup_ca.prepare(world, 1 + sum(args.sizes), args.timeout)
            replicas = 1
        for n in args.sizes:
            left = args.budget - (time.monotonic() - started)
            if (reason := skip_reason(n, sizes, left, args.standby > 0)) is not None:
                sizes.append({"hosts": n, "not_run": reason})
                continue
            traces, inspect_s, inspect_calls = add_hosts(world, n, args.timeout)
            replicas += n
            result = run_phase(world, traces, replicas, False, args.timeout, ca=autoscaler is not None)
            result.update(inspect_s=round(inspect_s, 1), inspect_robot_calls=inspect_calls)
            sizes.append(result)
            print(f"{n} host(s): {result.get('ready', 0)} ready in {result['wall_s']} s", flush=True)
        if args.standby and autoscaler is None:
            baked: dict[str, Any] | None = {} if args.image else None
            standby = standby_phase(world, args.standby, args.timeout, baked)
            print(f"standby {args.standby}: claim bound in {standby.get('time_to_claim_bound_s')}", flush=True)
            if baked:
                image = image_phase(world, args.standby, baked["spec"], args.timeout)
                image["bake_s"] = baked["bake_s"]
                print(f"image {args.standby}: claim bound in {image.get('time_to_claim_bound_s')}", flush=True)
        statuses = [e.status for e in world.robot.log]
    finally:
        if autoscaler is not None:
            autoscaler.stop()
        world.stop()
    return report(args, sizes, standby, statuses, time.monotonic() - started, image)


def report(
    args: argparse.Namespace,
    sizes: list[dict[str, Any]],
    standby: dict[str, Any] | None,
    statuses: list[int],
    wall: float,
    image: dict[str, Any] | None = None,
) -> dict[str, Any]:
    for r in [*sizes, standby or {}, image or {}]:
        if r.get("hosts") and "robot_calls" in r:
            r["robot_calls_per_node"] = round((r["robot_calls"] + r["inspect_robot_calls"]) / r["hosts"], 2)
            r["robot_calls_per_node_scaleup"] = round(r["robot_calls"] / r["hosts"], 2)
    ran = [r for r in sizes if r.get("ready")]
    cold = ran[0] if ran else None
    return {
        "bench": "scaleup",
        "autoscaler": args.autoscaler,
        "compression": args.compression,
        "timing_scale": args.timing_scale,
        "ansible_parallel": args.ansible_parallel or "default",
        "cpus": os.cpu_count(),
        "loadavg_1m_at_start": args.loadavg,
        "sizes": sizes,
        "standby": standby,
        "image": image,
        "routes": scaleup_image.routes(args.steps, cold, standby, image),
        "step_sources": hardware_model.sources(args.steps),
        "cold_vs_standby_claim_bound_s": {
            "cold": cold["time_to_claim_bound_s"]["mean"] if cold else None,
            "standby": (standby or {}).get("time_to_claim_bound_s", {}).get("mean"),
        },
        "http_403": statuses.count(403),
        "robot_calls": len(statuses),
        "goals": {"overhead_pct": GOAL_OVERHEAD_PCT, "robot_calls_per_node": GOAL_ROBOT_CALLS, "http_403": 0},
        "wall_s": round(wall, 1),
    }


def print_table(r: dict[str, Any]) -> None:
    print(
        f"\ncompression {r['compression']:g}x (Robot, resets, boots), operator timings /{r['timing_scale']:g}, "
        f"--ansible-parallel {r['ansible_parallel']}; "
        f"{r['cpus']} CPUs, load {r['loadavg_1m_at_start']:.1f} at start; Robot calls {r['robot_calls']}, "
        f"403s {r['http_403']}; OURS = overhead less CAPI's part; -A = Ansible counted as controller work"
    )
    cols = ("HOSTS", "READY", "TTR s", "BOUND s", "HW s", "OVER s", "OVER %", "OURS %", "HW-A s", "OURS-A %", "ROBOT/N")
    print("\n" + "".join(f"{c:>9}" for c in cols))
    rows = [(str(s["hosts"]), s) for s in r["sizes"]]
    if r["standby"]:
        rows.append((f"sb {r['standby']['hosts']}", r["standby"]))
    if r.get("image"):
        rows.append((f"img {r['image']['hosts']}", r["image"]))
    for label, s in rows:
        if s.get("errors", {}).get("by_type"):
            print(f"{label:>9}   host errors: {s['errors']['by_type']}")
        if "not_run" in s or not s.get("ready"):
            print(f"{label:>9}   not run: {s['not_run']}" if "not_run" in s else f"{label:>9}   none ready in time")
            continue
        a, b = s["ansible_as_hardware"], s["ansible_as_controller"]
        values = (s["ready"], s["time_to_ready_s"]["mean"], s["time_to_claim_bound_s"]["mean"], a["hardware_s"])
        values += (a["overhead_s"], a["overhead_pct"], a["operator_overhead_pct"], b["hardware_s"])
        values += (b["operator_overhead_pct"], s["robot_calls_per_node"])
        print(f"{label:>9}" + "".join(f"{v:>9.1f}" if isinstance(v, float) else f"{v!s:>9}" for v in values))
        if "ca_decision_s" in s:
            print(f"{'':>9}   CA raised the replicas to {s['ca_replicas']} after {s['ca_decision_s']} s")
    first = next((s for s in r["sizes"] if s.get("ready")), None)
    for label, s in (("cold, first size", first), ("standby", r["standby"])):
        if s and s.get("steps"):
            print(f"\n{label}, per host (mean s)   {'WALL':>7}{'HW':>7}{'OVER':>7}{'HW-A':>7}")
            for step, (wall, hw, hw_a) in s["steps"].items():
                print(f"  {step:<34}{wall:>7.2f}{hw:>7.2f}{wall - hw:>7.2f}{hw_a:>7.2f}")
    if r.get("routes"):
        route_cols = ("ROUTE", "REBOOTS/N", "CHANGED/N", "PKG/N", "CONFIG s", "BOUND s", "REAL min", "EST %")
        print("\nper node, simulator counts and times; REAL min: bench/hardware_model.py's GEX131 estimate")
        print("".join(f"{c:>11}" for c in route_cols))
        for x in r["routes"]:
            hw = x["real_hardware"]
            cells: tuple[Any, ...] = (x["route"], x["reboots_per_node"], x["changed_tasks_per_node"])
            cells += (x["package_tasks_changed_per_node"], x["configure_s"], x["claim_bound_s"])
            cells += (hw["minutes"], hw["estimated_part_pct"])
            print("".join(f"{v:>11.1f}" if isinstance(v, float) else f"{v!s:>11}" for v in cells))
        print("step times: " + "\n  ".join(["", *r["step_sources"]]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hosts", default="1,2", help="comma-separated scale-up sizes, each on fresh hosts")
    parser.add_argument("--standby", type=int, default=1, help="standby pool size for the standby phase (0: skip)")
    parser.add_argument(
        "--budget", type=float, default=330.0, help="seconds; larger sizes that would not fit are skipped"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per phase")
    parser.add_argument("--compression", type=float, default=600.0)
    parser.add_argument("--timing-scale", type=float, default=60.0)
    parser.add_argument(
        "--ansible-parallel",
        type=int,
        default=os.cpu_count() or 1,
        help="the operator's --ansible-parallel (0: its default); default: this machine's CPUs, which the "
        "simulated hosts' Ansible work shares (20 hosts on 2 CPUs: mean ready 345 s at 2, 607 s at 6)",
    )
    parser.add_argument(
        "--autoscaler",
        choices=("none", "ca"),
        default="none",
        help="ca: pending claim pods and the real cluster-autoscaler raise the replicas (no standby phase)",
    )
    parser.add_argument(
        "--image",
        action="store_true",
        help="after the standby phase's prepare, bake the standby (capi-gpu image bake) and provision --standby "
        "fresh hosts from it: the cold-from-image route, beside cold-full and standby",
    )
    parser.add_argument(
        "--step",
        action="append",
        default=[],
        metavar="NAME=SECONDS",
        help="replace a real-hardware step time of bench/hardware_model.py with your own measurement",
    )
    parser.add_argument("--keep", type=Path, default=None, help="state directory to keep (default: a temporary one)")
    args = parser.parse_args()
    try:
        args.steps = hardware_model.with_overrides({k: float(v) for k, _, v in (x.partition("=") for x in args.step)})
    except ValueError as exc:
        raise SystemExit(f"--step: {exc}") from None
    if args.image and not args.standby:
        raise SystemExit("--image bakes the standby phase's host: give --standby 1 or more")
    args.sizes = [int(x) for x in args.hosts.split(",") if x.strip()]
    args.loadavg = os.getloadavg()[0]
    if os.geteuid() != 0:
        raise SystemExit("the simulated fleet needs root (namespaces, cgroups, mounts)")
    if args.keep is not None:  # the operator's log, Ansible artifacts and the hosts' journals, to read after
        args.keep.mkdir(parents=True, exist_ok=True)
        result = measure(args, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="capi-gpu-scaleup-bench-") as tmp:
            result = measure(args, Path(tmp))
    print(json.dumps(result, separators=(",", ":")))
    print_table(result)


if __name__ == "__main__":
    main()
