"""`capi-gpu run`: the operator. Flags map onto ``Settings``; kopf does the watching."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capi_gpu import logs

if TYPE_CHECKING:
    from capi_gpu.leader import Elector
    from capi_gpu.probes import Probes
    from capi_gpu.runtime.deps import Deps
    from capi_gpu.runtime.settings import Settings
from capi_gpu.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run the operator")
    p.add_argument("--kubeconfig", help="management cluster kubeconfig (in-cluster config when unset)")
    p.add_argument("--namespace", default="", help="watch only this namespace (empty or *: all)")
    p.add_argument(
        "--watch-filter", default="", help="only objects labelled cluster.x-k8s.io/watch-filter=VALUE (empty or *: all)"
    )
    p.add_argument("--robot-url", default="", help="Robot webservice URL for every account (default: Hetzner's)")
    p.add_argument("--hcloud-endpoint", default="", help="hcloud API endpoint (default: Hetzner's)")
    p.add_argument(
        "--allow-plain-http", action="store_true", help="tests only: let --robot-url/--hcloud-endpoint be http"
    )
    p.add_argument("--robot-share", type=float, default=1.0, help="share of the Robot account budget (0-1]")
    p.add_argument("--timing-scale", type=float, default=1.0, help="divide provisioning timeouts (simulator only)")
    p.add_argument("--provisioning-limit", type=int, default=20, help="hosts inspecting/provisioning at once")
    p.add_argument(
        "--ansible-parallel", type=int, default=10, help="ansible-playbook runs at once (~100 MiB each); others queue"
    )
    p.add_argument("--artifacts-dir", type=Path, default=Path("/var/lib/capi-gpu/artifacts"))
    p.add_argument("--playbook-vars", type=Path, help="YAML of PlaybookVars overrides (package mirrors)")
    add_mig_parted_arg(p)
    p.add_argument(
        "--leader-elect", action="store_true", help="act only while holding a coordination.k8s.io Lease (replicas > 1)"
    )
    p.add_argument(
        "--leader-election-namespace",
        default="",
        help="namespace of the Lease (default: $POD_NAMESPACE, else capi-gpu-system)",
    )
    p.add_argument("--leader-election-id", default="capi-gpu-leader", help="name of the Lease")
    # controller-runtime's flags and defaults, as CAPI's managers expose them: "15s" or "15".
    p.add_argument("--leader-elect-lease-duration", type=seconds, default=15.0, help="Lease duration (15s)")
    p.add_argument("--leader-elect-renew-deadline", type=seconds, default=10.0, help="stop unless renewed (10s)")
    p.add_argument("--leader-elect-retry-period", type=seconds, default=2.0, help="between tries and renewals (2s)")
    p.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="liveness endpoint, from start (a standby too); /readyz beside it: 200 only while leading (empty: off)",
    )
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0: off)")
    p.add_argument("--metrics-address", default="0.0.0.0")
    p.add_argument("--no-gate", action="store_true", help="don't run the readiness gate")
    p.add_argument("--claim-scaler", action="store_true", help="run the claim-aware scaler (docs/autoscaling.md)")
    p.add_argument(
        "--claim-scaler-pods",
        choices=("all", "ca-declined"),
        default="all",
        help="ca-declined: with cluster-autoscaler in the cluster, take only pods CA declined (NotTriggerScaleUp)",
    )
    p.add_argument(
        "--claim-scaler-ca-grace",
        type=float,
        default=0.0,
        help="ca-declined: seconds CA's decline must stand before the claim scaler takes the pod",
    )
    p.add_argument(
        "--sync-autoscaler-annotations",
        action="store_true",
        help="keep cluster-autoscaler capacity annotations on GPU MachineDeployments in sync",
    )
    p.add_argument("--no-addons", action="store_true", help="don't install the DRA add-ons into workload clusters")
    p.add_argument("--addons-chart", default="", help="dra-driver-nvidia-gpu chart location (mirror or .tgz path)")
    p.add_argument(
        "--addons-chart-registry",
        action="append",
        default=[],
        help="registry (host[:port]) a cluster's chartRef may name as oci://; repeat for more "
        "(default: registry.k8s.io; any other chartRef but --addons-chart is refused)",
    )
    p.add_argument("--helm", default="helm", help="helm binary for the add-ons playbook")
    p.add_argument(
        "--gate-plugin-image",
        default="",
        help="image of the gate driver's kubelet plugin (the shipped Deployment sets the operator's own; "
        "empty: config/dra/gate-plugin-daemonset.yaml's development image)",
    )
    p.add_argument("--webhook-port", type=int, default=0, help="validating webhook port, HTTPS (0: off)")
    p.add_argument("--webhook-address", default="0.0.0.0", help="validating webhook listen address")
    p.add_argument(
        "--webhook-cert-dir",
        type=Path,
        default=Path("/tmp/k8s-webhook-server/serving-certs"),
        help="directory with the webhook's tls.crt and tls.key",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--log-format", choices=("text", "json"), default="text", help="json: one object per line")
    p.set_defaults(func=run)


def add_mig_parted_arg(p: argparse.ArgumentParser) -> None:
    from capi_gpu.provisioning import shipped_mig_parted

    p.add_argument(
        "--mig-parted",
        type=Path,
        default=None,
        help=f"the nvidia-mig-parted binary copied to every host (default: ${shipped_mig_parted.ENV}, "
        f"else {shipped_mig_parted.DEFAULT_PATH}, where the image has it); unused when --playbook-vars "
        "names an nvidia-mig-manager .deb",
    )


def playbook_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """--playbook-vars plus the shipped nvidia-mig-parted and its checksum; ``ShippedBinaryError`` or
    ``ValueError`` when either cannot be used (the operator then refuses to start)."""
    from capi_gpu.provisioning import playbook_vars, shipped_mig_parted
    from capi_gpu.runtime.settings import Settings

    path = args.mig_parted or shipped_mig_parted.default_path()
    out = shipped_mig_parted.with_shipped_binary(Settings.load_overrides(args.playbook_vars), path)
    playbook_vars.check_overrides(out)
    return out


def operator_playbook_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """``playbook_overrides`` for the operator: a missing binary is a warning, not a refusal to start."""
    import logging

    from capi_gpu.provisioning import playbook_vars, shipped_mig_parted
    from capi_gpu.runtime.settings import Settings

    try:
        return playbook_overrides(args)
    except shipped_mig_parted.ShippedBinaryMissing as exc:
        logging.getLogger(__name__).warning("%s; hosts stop in Configure until it is there", exc)
        out = Settings.load_overrides(args.playbook_vars)
        playbook_vars.check_overrides(out)
        return out


def seconds(value: str) -> float:
    """A duration flag: "15s" (controller-runtime's form) or a bare number of seconds."""
    try:
        out = float(value.removesuffix("s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration in seconds (e.g. 15s)") from None
    if out <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: a duration must be positive")
    return out


def every(value: str) -> str | None:
    """'' and '*' mean all namespaces / all objects. '*' because clusterctl treats a variable whose default
    is empty as unset and refuses to install, so the shipped Deployment defaults to '*' (never a valid
    namespace or label value)."""
    return None if value in ("", "*") else value


def run(args: argparse.Namespace) -> int:
    import kopf
    from prometheus_client import start_http_server

    from capi_gpu.controllers import handlers
    from capi_gpu.probes import Probes
    from capi_gpu.provisioning import chartref
    from capi_gpu.runtime.settings import Settings

    for url in filter(None, (args.robot_url, args.hcloud_endpoint)):
        problem = Settings.endpoint_problem(url, args.allow_plain_http)
        if problem is not None:
            print(f"capi-gpu run: {problem}", file=sys.stderr)
            return EXIT_USAGE
    if args.leader_elect:
        from capi_gpu.leader import timing_problem

        problem = timing_problem(
            args.leader_elect_lease_duration, args.leader_elect_renew_deadline, args.leader_elect_retry_period
        )
        if problem is not None:
            print(f"capi-gpu run: {problem}", file=sys.stderr)
            return EXIT_USAGE
    logs.configure(args.verbose, args.log_format)
    from capi_gpu.provisioning import shipped_mig_parted

    try:
        overrides = operator_playbook_overrides(args)
    except (shipped_mig_parted.ShippedBinaryError, ValueError) as exc:
        print(f"capi-gpu run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    settings = Settings(
        namespace=every(args.namespace),
        watch_filter=every(args.watch_filter),
        robot_url=args.robot_url or None,
        hcloud_endpoint=args.hcloud_endpoint or None,
        robot_share=args.robot_share,
        timing_scale=args.timing_scale,
        provisioning_limit=args.provisioning_limit,
        ansible_parallel=args.ansible_parallel,
        artifacts_dir=args.artifacts_dir,
        playbook_overrides=overrides,
        gate=not args.no_gate,
        claim_scaler=args.claim_scaler,
        claim_scaler_pods=args.claim_scaler_pods,
        claim_scaler_ca_grace=args.claim_scaler_ca_grace,
        template_sync_annotations=args.sync_autoscaler_annotations,
        addons=not args.no_addons,
        addons_chart=args.addons_chart or None,
        addons_chart_registries=tuple(args.addons_chart_registry) or chartref.DEFAULT_REGISTRIES,
        helm=args.helm,
        gate_plugin_image=args.gate_plugin_image,
        webhook_port=args.webhook_port,
        webhook_address=args.webhook_address,
        webhook_cert_dir=args.webhook_cert_dir,
    )

    registry = kopf.OperatorRegistry()
    handlers.register(registry, settings, lambda: make_deps(args.kubeconfig, settings))
    if args.kubeconfig:
        import os

        os.environ["KUBECONFIG"] = args.kubeconfig

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if args.kubeconfig:
            return kopf.login_with_kubeconfig(**kwargs)
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_address)

    async def operate(stop: asyncio.Event) -> None:
        # standalone: kopf's own peering would need the shared kopf.dev CRDs (capi_gpu/leader.py says why).
        await kopf.operator(
            registry=registry,
            clusterwide=settings.namespace is None,
            namespaces=[settings.namespace] if settings.namespace else [],
            standalone=True,
            stop_flag=stop,
            ready_flag=probes.up if probes else None,
        )

    # Our own probe server, not kopf's liveness_endpoint: kopf's would only answer once this replica leads.
    probes = Probes(args.liveness, webhook=bool(settings.webhook_port)) if args.liveness else None
    webhook = make_webhook(args.kubeconfig, settings)
    return asyncio.run(lead_then(operate, make_elector(args) if args.leader_elect else None, probes, webhook))


Serve = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


def make_webhook(kubeconfig: str | None, settings: Settings) -> Serve | None:
    """The webhook, served by every replica from the start (controllers/webhook.serve), with a client of
    its own: two threads and connections that the operator's writes never hold."""
    if not settings.webhook_port:
        return None
    from capi_gpu.controllers import webhook
    from capi_gpu.kube import AsyncKube, Kube

    kube = AsyncKube(Kube.in_cluster_or_kubeconfig(kubeconfig, pool_size=2), workers=2)
    server = webhook.server(settings.webhook_address, settings.webhook_port, settings.webhook_cert_dir)

    async def serve(serving: asyncio.Event) -> None:
        try:
            await webhook.serve(server, kube, serving, settings.chart_policy)
        finally:
            kube.close()

    return serve


def make_deps(kubeconfig: str | None, settings: Settings) -> Deps:
    from capi_gpu.kube import AsyncKube, Kube
    from capi_gpu.provisioning.addons import AnsibleAddons
    from capi_gpu.provisioning.ansible import AnsibleRunner
    from capi_gpu.runtime.deps import Deps, RobotClients

    # As many kept connections as call threads (and a few for watches): the client's default, 5 per CPU,
    # is 10 on 2 CPUs, and at 20 hosts every surplus call paid a fresh connection ("pool is full").
    workers = 16
    kube = AsyncKube(Kube.in_cluster_or_kubeconfig(kubeconfig, pool_size=workers + 4), workers=workers)
    runner = AnsibleRunner(
        artifacts_root=settings.artifacts_dir, parallel=settings.ansible_parallel, timeout_s=settings.ansible_timeout_s
    )
    installer = None
    if settings.addons:
        installer = AnsibleAddons(artifacts_root=settings.artifacts_dir / "addons", helm_binary=settings.helm)
    return Deps(
        kube=kube,
        settings=settings,
        runner=runner,
        robots=RobotClients(settings),
        addons=installer,
    )


async def lead_then(
    operate: Callable[[asyncio.Event], Awaitable[None]],
    elector: Elector | None,
    probes: Probes | None = None,
    webhook: Serve | None = None,
) -> int:
    """Run ``operate`` (until it returns), only while ``elector`` holds the Lease when there is one. A lost
    Lease stops it and exits non-zero, so the container restarts as a candidate; a clean stop releases it.
    ``probes`` and ``webhook`` serve from the start, on a standby candidate too (capi_gpu/probes.py)."""
    runner = await probes.start() if probes is not None else None
    serving = probes.serving if probes is not None else asyncio.Event()
    hook: asyncio.Task[None] | None = asyncio.create_task(webhook(serving)) if webhook is not None else None
    try:
        return await _lead_then(operate, elector, probes)
    finally:
        if hook is not None:
            hook.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await hook
        if runner is not None:
            await runner.cleanup()


async def _lead_then(
    operate: Callable[[asyncio.Event], Awaitable[None]], elector: Elector | None, probes: Probes | None
) -> int:
    stop = asyncio.Event()
    if elector is None:
        if probes is not None:
            probes.leading = True
        await operate(stop)
        return EXIT_OK
    await elector.acquire()
    if probes is not None:
        probes.leading = True
    keeper = asyncio.create_task(elector.keep(stop))
    try:
        await operate(stop)
    finally:
        if probes is not None:
            probes.leading = False
        stop.set()
        await keeper
    if elector.lost:
        return EXIT_FAILED
    await asyncio.to_thread(elector.release)
    return EXIT_OK


def make_elector(args: argparse.Namespace) -> Elector:
    import os
    import socket
    import uuid

    from capi_gpu.kube import Kube
    from capi_gpu.leader import Elector

    namespace = args.leader_election_namespace or os.environ.get("POD_NAMESPACE") or "capi-gpu-system"
    # The pod's name (downward API) plus a random suffix, as client-go does: a restarted container of the
    # same pod is a new candidate, not the old holder renewing.
    identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"
    return Elector(
        Kube.in_cluster_or_kubeconfig(args.kubeconfig),
        namespace,
        args.leader_election_id,
        identity,
        duration_s=max(1, round(args.leader_elect_lease_duration)),  # leaseDurationSeconds is an integer
        renew_deadline_s=args.leader_elect_renew_deadline,
        retry_s=args.leader_elect_retry_period,
    )
