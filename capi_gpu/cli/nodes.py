"""`capi-gpu nodes relayout NODE --layout ...`: the re-layout runbook as one command (see relayout.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from capi_gpu import domain
from capi_gpu.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, kubeargs
from capi_gpu.cli import run as run_cli
from capi_gpu.kube import SECRETS, Kube
from capi_gpu.runtime import workload


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("nodes", help="operate on GPU nodes")
    nsub = p.add_subparsers(dest="nodes_command", required=True)
    r = nsub.add_parser("relayout", help="change a node's MIG layout: cordon, taint, drain, apply, verify, untaint")
    r.add_argument("node")
    r.add_argument("--layout", required=True, help="mig-parted preset (all-1g.24gb) or 1g.24gb=2,2g.48gb=1")
    kubeargs.add_kube_args(r)
    r.add_argument("--workload-kubeconfig", help="the workload cluster (default: the Secret <cluster>-kubeconfig)")
    r.add_argument("--cluster", help="Cluster name, to find <cluster>-kubeconfig")
    r.add_argument("--playbook-vars", type=Path, help="PlaybookVars overrides (package mirrors), as for `run`")
    run_cli.add_mig_parted_arg(r)
    r.add_argument("--artifacts-dir", type=Path, default=Path("/tmp/capi-gpu-relayout"))
    r.add_argument("--dra-plugin-selector", default=domain.NVIDIA_PLUGIN_SELECTOR)
    r.add_argument("--timeout", type=float, default=900)
    r.set_defaults(func=kubeargs.guarded(relayout))


def _workload(args: argparse.Namespace, mgmt: Kube, namespace: str) -> Kube:
    if args.workload_kubeconfig:
        return Kube.from_kubeconfig(args.workload_kubeconfig)
    if not args.cluster:
        raise kubeargs.CliFailure("give --cluster (for <cluster>-kubeconfig) or --workload-kubeconfig", EXIT_USAGE)
    secret = mgmt.get(SECRETS, f"{args.cluster}-kubeconfig", namespace)
    try:
        return Kube.from_kubeconfig_dict(workload.parse(secret))
    except workload.UnsafeKubeconfig as exc:
        raise kubeargs.CliFailure(str(exc), EXIT_USAGE) from exc


def relayout(args: argparse.Namespace) -> int:
    from capi_gpu.provisioning import shipped_mig_parted
    from capi_gpu.relayout import Relayout, RelayoutError

    try:
        overrides = run_cli.playbook_overrides(args)
    except (shipped_mig_parted.ShippedBinaryError, ValueError) as exc:
        raise kubeargs.CliFailure(str(exc), EXIT_USAGE) from exc
    mgmt = kubeargs.connect(args)
    namespace = kubeargs.namespace(args) or "default"
    workload = _workload(args, mgmt, namespace)
    job = Relayout(
        mgmt,
        workload,
        namespace,
        args.node,
        args.layout,
        args.artifacts_dir,
        overrides,
        args.dra_plugin_selector,
        args.timeout,
    )
    try:
        job.run()
    except RelayoutError as exc:
        raise kubeargs.CliFailure(str(exc), EXIT_USAGE if exc.usage else EXIT_FAILED) from exc
    print(f"{args.node}: layout {args.layout} applied and verified")
    return EXIT_OK
