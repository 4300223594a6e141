"""Operator steady state at scale: RSS, CPU seconds and API requests with N hosts + N machines watched.

Why: every HetznerGPUHost and HetznerGPUMachine has its own daemon (``runtime.loops``) that re-reads
what it needs each pass, so an idle fleet still costs CPU, memory and apiserver traffic. This measures
that cost on the real apiserver with objects that give the operator real work and no hardware:

* hosts: half ``Available`` (inspected: fake GEX131 hardware written through the status subresource),
  half ``Maintenance`` (``spec.maintenanceMode``); neither state probes Robot or SSH;
* machines: no owning CAPI Machine yet, so each pass waits for its owner.

Counting: the apiserver's own ``apiserver_request_total`` from ``/metrics`` (by verb and resource),
read before and after a fixed window. Nothing but the operator and the apiserver itself (its loopback
client: leases, endpoints) talks to this apiserver then: kube-controller-manager, kube-scheduler and
CAPI are not started, and the bench only reads ``/metrics`` (a non-resource path, not counted). Only
resources the operator's shipped RBAC (``config/rbac/*role*.yaml``) grants are counted, less what a
baseline window before the operator starts saw on them (the apiserver's own share). A pass of a daemon starts
with one GET of its own object, so the GETs on each kind count the passes; requests per object per
resync = that kind's requests / its passes (Secrets are read by host passes only).

``--timing-scale`` divides the operator's timings (the simulator's knob): at the default 10, an idle
host and a machine waiting for its owner resync every 30 s instead of 300 s, so a window of two
resyncs (the default) sees every object twice in a minute. CPU and requests per second are then ten
times production's; the per-pass cost (requests per object per resync) does not depend on the scale.
``--timing-scale 1`` measures production timing (a 600 s window).

Run: ``.venv/bin/python bench/scale.py [--objects 1000] [--window 60]``. Prints one JSON line and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from capi_gpu.api.host import (
    DiskInfo,
    GPUInfo,
    HardwareDetails,
    HetznerGPUHost,
    HetznerGPUHostSpec,
    HetznerGPUHostStatus,
    HostState,
)
from capi_gpu.api.machine import HetznerGPUMachine, HetznerGPUMachineSpec
from capi_gpu.api.specs import GPUSpec, MigLayout
from capi_gpu.kube import NAMESPACES, SECRETS, Kube, ours
from capi_gpu.provisioning.model import Timing
from capi_gpu_sim.controlplane import ControlPlane, Options
from capi_gpu_sim.hosts import keys
from capi_gpu_sim.procs import Proc
from capi_gpu_sim.robot import RobotSim

HOSTS = ours("hetznergpuhosts")
MACHINES = ours("hetznergpumachines")
NAMESPACE = "scale"
CLK_TCK = os.sysconf("SC_CLK_TCK")
RBAC = Path(__file__).resolve().parents[1] / "config" / "rbac"

Key = tuple[str, str]  # (verb, resource[/subresource])


class Apiserver:
    """``apiserver_request_total`` by (verb, resource), resource requests only."""

    def __init__(self, cp: ControlPlane) -> None:
        self.url = f"{cp.url}/metrics"
        self.client = httpx.Client(
            verify=ssl.create_default_context(cafile=str(cp.ca.cert_path)),
            headers={"Authorization": f"Bearer {cp.token}"},
            timeout=10,
        )

    def requests(self) -> Counter[Key]:
        out: Counter[Key] = Counter()
        for family in text_string_to_metric_families(self.client.get(self.url).text):
            if family.name != "apiserver_request":
                continue
            for s in family.samples:
                if not s.name.endswith("_total") or not s.labels.get("resource"):
                    continue
                res = s.labels["resource"] + (f"/{s.labels['subresource']}" if s.labels.get("subresource") else "")
                out[(s.labels["verb"], res)] += int(s.value)
        return out

    def close(self) -> None:
        self.client.close()


def rbac_resources() -> set[str]:
    """Every resource (and ``resource/subresource``) a rule of the operator's shipped roles names."""
    out: set[str] = set()
    for path in sorted(RBAC.glob("*role*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in ("ClusterRole", "Role"):
                out.update(r for rule in doc.get("rules") or [] for r in rule.get("resources") or [])
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def host_body(i: int) -> dict[str, Any]:
    spec = HetznerGPUHostSpec(server_number=3_000_000 + i, maintenance_mode=i % 2 == 1)
    body = HetznerGPUHost(metadata={"name": f"gex131-{i:04d}"}, spec=spec).wire()
    body.pop("status", None)
    return body


def host_status(i: int) -> dict[str, Any]:
    if i % 2 == 1:
        return HetznerGPUHostStatus(state=HostState.MAINTENANCE).wire()
    hardware = HardwareDetails(
        cpu_threads=48,
        memory_mib=257672,
        disks=[DiskInfo(wwn=f"eui.{i:016x}", size_bytes=960197124096, model="SAMSUNG MZQL2960HCJR")],
        gpus=[GPUInfo(vendor_id="10de", device_id="2bb5", model="rtx-pro-6000", mig_capable=True)],
    )
    return HetznerGPUHostStatus(
        state=HostState.AVAILABLE,
        server_name=f"gex131-{i:04d}",
        ipv4=f"192.0.2.{i % 250 + 1}",  # TEST-NET-1: nothing connects (an idle host probes nothing)
        datacenter="FSN1-DC14",
        product="GEX131",
        hardware=hardware,
    ).wire()


def machine_body(i: int) -> dict[str, Any]:
    spec = HetznerGPUMachineSpec(gpu=GPUSpec(layout=MigLayout(preset="all-1g.24gb")))
    body = HetznerGPUMachine(metadata={"name": f"gpu-{i:04d}"}, spec=spec).wire()
    body.pop("status", None)
    return body


def populate(kube: Kube, robot: RobotSim, n: int) -> float:
    started = time.monotonic()
    kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    key = keys.generate(comment="bench-scale")
    for name, data in (
        ("robot-credentials", {"robot-user": robot.username, "robot-password": robot.password}),
        ("robot-ssh", {"ssh-privatekey": key.private_openssh, "ssh-publickey": key.public_line}),
    ):
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data}
        kube.create(SECRETS, secret, NAMESPACE)

    def host(i: int) -> None:
        created = kube.create(HOSTS, host_body(i), NAMESPACE)
        created["status"] = host_status(i)
        kube.replace(HOSTS, created, NAMESPACE, sub="status")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(host, range(n)))
        list(pool.map(lambda i: kube.create(MACHINES, machine_body(i), NAMESPACE), range(n)))
    return time.monotonic() - started


def start_operator(cp: ControlPlane, robot: RobotSim, workdir: Path, timing_scale: float) -> Proc:
    argv = [sys.executable, "-m", "capi_gpu.cli", "run", "--kubeconfig", str(cp.kubeconfig)]
    argv += ["--robot-url", robot.url, "--allow-plain-http", "--timing-scale", str(timing_scale)]
    argv += ["--metrics-port", "0", "--liveness", "", "--no-addons"]  # no chart pulls from a benchmark
    argv += ["--artifacts-dir", str(workdir / "artifacts")]
    return Proc("operator", argv, workdir / "logs", cp.registry)


def settled(kube: Kube, n: int) -> bool:
    """Every object had its first pass: machines have conditions, hosts their OS host key Secret."""
    machines = kube.list(MACHINES, NAMESPACE)
    if sum(1 for m in machines if (m.get("status") or {}).get("conditions")) < n:
        return False
    return sum(1 for s in kube.list(SECRETS, NAMESPACE) if s["metadata"]["name"].endswith("-os-hostkey")) >= n


WRITES = ("POST", "PATCH", "PUT", "DELETE")


def quiet(api: Apiserver, op: Proc, deadline: float, interval: float = 5.0) -> None:
    """Until an interval passes with no write on what the operator may touch: every first pass (the OS
    host key Secret, the first status, condition and label writes) is behind us, steady state begins."""
    granted = rbac_resources()

    def writes() -> int:
        return sum(v for (verb, res), v in api.requests().items() if verb in WRITES and res in granted)

    last = writes()
    while True:
        time.sleep(interval)
        now = writes()
        if now == last:
            return
        if not op.alive() or time.monotonic() > deadline:
            raise SystemExit(f"operator did not settle (alive={op.alive()}):\n{op.tail()}")
        last = now


def window(api: Apiserver, pid: int | None, seconds: float) -> tuple[Counter[Key], float, list[float]]:
    before, cpu0, rss = api.requests(), cpu_seconds(pid) if pid else 0.0, []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        if pid:
            rss.append(rss_mb(pid))
    after = api.requests()
    after.subtract(before)
    return +after, (cpu_seconds(pid) - cpu0) if pid else 0.0, rss


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    n = args.objects
    # The idle requeue of a free host (states.available/maintenance) and of a machine waiting for its
    # owner (machine_loop._woken_wait); the measured periods are reported.
    period = Timing().scaled(args.timing_scale).poll * 30
    args.window = args.window or 2 * period
    opts = Options(with_scheduler=False, with_controller_manager=False, with_capi=False)
    with ControlPlane(workdir / "cp", opts) as cp, RobotSim(compression=1.0) as robot:
        kube, api = cp.kube(), Apiserver(cp)
        try:
            populate_s = populate(kube, robot, n)
            print(f"{n} hosts + {n} machines created in {populate_s:.1f} s", flush=True)
            baseline, _, _ = window(api, None, args.baseline)
            op = start_operator(cp, robot, workdir, args.timing_scale)
            try:
                started, cpu_start, before_warmup = time.monotonic(), 0.0, api.requests()
                deadline = started + args.settle_timeout
                while not settled(kube, n):
                    if not op.alive() or time.monotonic() > deadline:
                        raise SystemExit(f"operator did not settle (alive={op.alive()}):\n{op.tail()}")
                    time.sleep(2.0)
                first_pass_s = time.monotonic() - started
                quiet(api, op, deadline)
                warmup = api.requests()
                warmup.subtract(before_warmup)
                cpu_start, rss_start = cpu_seconds(op.pid), rss_mb(op.pid)
                print(f"operator settled: first pass of every object after {first_pass_s:.1f} s", flush=True)
                counted, cpu, rss = window(api, op.pid, args.window)
                alive = op.alive()
            finally:
                op.stop()
        finally:
            api.close()
            kube.close()
        robot_calls = len(robot.log)
    granted, scale = rbac_resources(), args.window / args.baseline
    operator = +Counter({k: v - round(baseline.get(k, 0) * scale) for k, v in counted.items() if k[1] in granted})
    startup = (populate_s, first_pass_s, warmup, cpu_start, rss_start)
    return report(args, n, startup, operator, cpu, rss, robot_calls, alive, baseline)


def report(
    args: argparse.Namespace,
    n: int,
    startup: tuple[float, float, Counter[Key], float, float],
    operator: Counter[Key],
    cpu: float,
    rss: list[float],
    robot_calls: int,
    alive: bool,
    baseline: Counter[Key],
) -> dict[str, Any]:
    populate_s, first_pass_s, warmup, startup_cpu, startup_rss = startup

    def on(*resources: str) -> int:
        return sum(v for (_, r), v in operator.items() if r.split("/")[0] in resources)

    host_passes, machine_passes = operator[("GET", "hetznergpuhosts")], operator[("GET", "hetznergpumachines")]
    host_requests, machine_requests = on("hetznergpuhosts", "secrets"), on("hetznergpumachines")
    total = sum(operator.values())
    passes = host_passes + machine_passes
    return {
        "bench": "scale",
        "objects": {"hosts": n, "machines": n},
        "timing_scale": args.timing_scale,
        "resync_s": {  # measured: window x objects / passes
            "host": round(args.window * n / host_passes, 1) if host_passes else None,
            "machine": round(args.window * n / machine_passes, 1) if machine_passes else None,
        },
        "window_s": args.window,
        "operator_alive": alive,
        "rss_mb": {"mean": round(sum(rss) / len(rss), 1), "max": round(max(rss), 1)} if rss else {},
        "cpu_s": round(cpu, 2),
        "cpu_percent": round(100 * cpu / args.window, 1),
        "requests": total,
        "requests_per_s": round(total / args.window, 2),
        "passes": {"host": host_passes, "machine": machine_passes},
        "requests_per_object_per_resync": {
            "all": round(total / passes, 2) if passes else None,
            "host": round(host_requests / host_passes, 2) if host_passes else None,
            "machine": round(machine_requests / machine_passes, 2) if machine_passes else None,
        },
        "by_request": {f"{v} {r}": c for (v, r), c in sorted(operator.items(), key=lambda kv: -kv[1])},
        "startup": {
            "populate_s": round(populate_s, 1),
            "first_pass_all_s": round(first_pass_s, 1),
            "cpu_s": round(startup_cpu, 1),
            "rss_mb": round(startup_rss, 1),
            "requests": sum(warmup.values()),
        },
        "baseline_requests_per_s": round(sum(baseline.values()) / args.baseline, 2),
        "robot_calls": robot_calls,
    }


def print_table(r: dict[str, Any]) -> None:
    per = r["requests_per_object_per_resync"]
    print(f"\n{r['objects']['hosts']} hosts + {r['objects']['machines']} machines, timing scale {r['timing_scale']:g} "
          f"(measured resync: host {r['resync_s']['host']} s, machine {r['resync_s']['machine']} s), "
          f"window {r['window_s']:g} s")  # fmt: skip
    print(f"{'operator RSS':<34}{r['rss_mb'].get('mean', 0):>10.1f} MB (max {r['rss_mb'].get('max', 0):.1f})")
    print(f"{'operator CPU':<34}{r['cpu_s']:>10.2f} s ({r['cpu_percent']:.1f} % of one core)")
    print(f"{'API requests':<34}{r['requests']:>10} ({r['requests_per_s']:.1f}/s)")
    print(f"{'requests per object per resync':<34}{per['all'] or 0:>10.2f} (host {per['host'] or 0:.2f}, "
          f"machine {per['machine'] or 0:.2f})")  # fmt: skip
    print(f"{'startup: first pass of all':<34}{r['startup']['first_pass_all_s']:>10.1f} s, "
          f"{r['startup']['cpu_s']:.1f} CPU s, {r['startup']['requests']} requests")  # fmt: skip
    print(f"{'Robot calls':<34}{r['robot_calls']:>10}")
    print(f"\n{'REQUEST':<40}{'COUNT':>8}")
    for req, count in r["by_request"].items():
        print(f"{req:<40}{count:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--objects", type=int, default=1000, help="hosts, and as many machines")
    parser.add_argument("--window", type=float, default=None, help="steady-state window, s (two resyncs)")
    parser.add_argument("--baseline", type=float, default=15.0, help="apiserver-only window, seconds")
    parser.add_argument("--timing-scale", type=float, default=10.0, help="the operator's --timing-scale")
    parser.add_argument("--settle-timeout", type=float, default=300.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="capi-gpu-scale-bench-") as tmp:
        result = measure(args, Path(tmp))
    print(json.dumps(result, separators=(",", ":")))
    print_table(result)


if __name__ == "__main__":
    main()
