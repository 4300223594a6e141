"""`capi-gpu autoscaler annotate`: write the cluster-autoscaler annotations a GPU MachineDeployment needs,
computed from its HetznerGPUMachineTemplate, and optionally who owns its scale-ups.

A hand-written annotation drifts from the template the day someone changes the MIG layout or a bigger
host joins the pool; this reads the same facts the controllers use (``capi_gpu.autoscaler.annotations``)
and writes only the keys it owns, as one merge patch. ``--dry-run`` prints the patch without sending it.
The operator's ``--sync-autoscaler-annotations`` keeps them current afterwards.

Exit codes: 0 written (or nothing to change), 1 the MachineDeployment or template is missing or not a
GPU node group the annotations can describe, 2 usage, 3 the apiserver failed (see ``kubeargs``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from capi_gpu import domain, kube
from capi_gpu.autoscaler import annotations as ca_annotations
from capi_gpu.autoscaler import nodegroup
from capi_gpu.autoscaler.annotations import GpuResource
from capi_gpu.autoscaler.nodegroup import ScaleOwner
from capi_gpu.cli import EXIT_OK, kubeargs
from capi_gpu.cli.kubeargs import CliFailure

TEMPLATES = kube.ours("hetznergpumachinetemplates")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("autoscaler", help="cluster-autoscaler integration: annotate GPU MachineDeployments")
    verbs = p.add_subparsers(dest="autoscaler_command", required=True)
    v = verbs.add_parser("annotate", help="write CA capacity annotations, labels and taints from the template")
    kubeargs.add_kube_args(v)
    kubeargs.add_output_arg(v)
    v.add_argument("machinedeployment", help="MachineDeployment name")
    v.add_argument("--dry-run", action="store_true", help="print the patch, change nothing")
    v.add_argument(
        "--owner",
        choices=[o.value for o in ScaleOwner],
        help="who raises its replicas (annotation "
        "and label; cluster-autoscaler discovers only its own with a label filter)",
    )
    v.add_argument(
        "--gpu-resource",
        choices=[g.value for g in GpuResource],
        help="how a whole-GPU node "
        "advertises its GPU: dra (dra-driver + gpu-count) or device-plugin (gpu-type + gpu-count); "
        "default: the form the MachineDeployment already has, else dra",
    )
    v.add_argument("--max-pods", type=int, default=ca_annotations.DEFAULT_MAX_PODS, help="maxPods annotation")
    v.set_defaults(func=kubeargs.guarded(run_annotate))


def plan(md: dict[str, Any], template: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """What annotate would write: desired annotations and labels, the patch (None: nothing to do), notes."""
    try:
        shape = nodegroup.node_shape(template)
        form = GpuResource(args.gpu_resource) if args.gpu_resource else ca_annotations.gpu_resource_of(md)
        owner = ScaleOwner(args.owner) if args.owner else None
        want = ca_annotations.desired(md, shape, gpu_resource=form, max_pods=args.max_pods, owner=owner)
    except (nodegroup.NotAGroup, ca_annotations.Incomplete) as exc:
        raise CliFailure(f"{nodegroup.TEMPLATE_KIND} {template['metadata']['name']}: {exc}") from exc
    notes = list(want.notes)
    if nodegroup.bounds(md) is None:
        notes.append(f"no valid {domain.CA_MIN_SIZE_ANNOTATION}/-max-size annotations: not a node group yet")
    return {
        "machineDeployment": f"{md['metadata'].get('namespace', '')}/{md['metadata']['name']}",
        "annotations": want.present(),
        "labels": want.labels,
        "removed": sorted(k for k, v in want.annotations.items() if v is None),
        "patch": ca_annotations.merge_patch(md, want),
        "notes": notes,
    }


def run_annotate(args: argparse.Namespace) -> int:
    if args.max_pods < 1:
        raise CliFailure("--max-pods must be at least 1", code=2)
    client = kubeargs.connect(args)
    ns = kubeargs.namespace(args)
    md = client.get(kube.CAPI_MACHINEDEPLOYMENTS, args.machinedeployment, ns)
    try:
        template_name = nodegroup.template_name(md)
    except nodegroup.NotAGroup as exc:
        raise CliFailure(f"MachineDeployment {args.machinedeployment}: {exc}") from exc
    template = client.get(TEMPLATES, template_name, ns)
    result = plan(md, template, args)
    if result["patch"] is not None and not args.dry_run:
        client.patch(kube.CAPI_MACHINEDEPLOYMENTS, args.machinedeployment, result["patch"], ns)
    result["applied"] = result["patch"] is not None and not args.dry_run
    _print(result, args)
    return EXIT_OK


def _print(result: dict[str, Any], args: argparse.Namespace) -> None:
    if args.output == "json":
        kubeargs.print_json(result)
        return
    rows = [(k, v) for k, v in sorted(result["annotations"].items())]
    rows += [(f"{k} (label)", v) for k, v in sorted(result["labels"].items())]
    rows += [(k, "(removed)") for k in result["removed"]]
    kubeargs.print_table(("key", "value"), rows)
    if result["patch"] is None:
        status = "already up to date"
    elif args.dry_run:
        status = "dry run: not applied"
    else:
        status = "applied"
    print(f"{result['machineDeployment']}: {status}")
    for note in result["notes"]:
        print(f"note: {note}", file=sys.stderr)
