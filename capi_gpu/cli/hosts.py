"""`capi-gpu hosts`: the operator's levers on the HetznerGPUHost pool, with the guard rails kubectl lacks.

Everything here could be done with ``kubectl patch``, and the runbooks show both. The CLI exists for
the checks a hand-written patch skips: ``register`` refuses a Robot server number that is already in
the namespace (two hosts for one server would be provisioned twice), ``inspect`` and ``retire`` refuse
a host a Machine is using (re-inspection reboots it into rescue; retiring it under a running node is a
decision that needs ``--force``). Each change is a merge patch carrying the ``resourceVersion`` it was
decided on, so a host claimed between the check and the patch makes the patch fail (409) and the check
runs again, instead of the refusal being skipped.

Objects of our kinds are built and changed through the pydantic models (``capi_gpu.api.host``), so
a bad ``--server`` or ``--label`` is a usage error here, not a 422 later. ``list`` reads raw dicts
and tolerates states this version does not know. Exit codes: 0 done, 1 not found or refused, 2 usage,
3 the apiserver failed (see ``kubeargs``). ``hosts order`` lives in ``hosts_order``; ``hosts watch`` draws
the live view of ``capi_gpu.cli.live`` (the one ``dev up`` shows) from any management cluster.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import pydantic

from capi_gpu import domain, kube
from capi_gpu.api import base
from capi_gpu.api.host import HetznerGPUHost, HetznerGPUHostSpec, RobotAccess
from capi_gpu.cli import EXIT_EXTERNAL, EXIT_OK, EXIT_USAGE, hosts_order, kubeargs, live
from capi_gpu.cli.kubeargs import CliFailure
from capi_gpu.unstructured import as_map

HOSTS = kube.ours("hetznergpuhosts")
COLUMNS = ("name", "server", "state", "step", "gpu", "layout", "consumer", "ready", "error", "flags")
_PATCH_ATTEMPTS = 3


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("hosts", help="HetznerGPUHost pool: list, watch, register, inspect, maintenance, retire, order")
    verbs = p.add_subparsers(dest="hosts_command", required=True)

    def verb(name: str, help_text: str, body: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        v = verbs.add_parser(name, help=help_text)
        kubeargs.add_kube_args(v, all_namespaces=name == "list")
        kubeargs.add_output_arg(v)
        v.set_defaults(func=kubeargs.guarded(body))
        return v

    verb("list", "hosts with state, step, GPU, layout, consumer, readiness and error", run_list)

    v = verb("register", "add a leased Robot server to the pool (refuses a server number already there)", run_register)
    v.add_argument("--server", type=int, required=True, metavar="N", help="Robot server number")
    v.add_argument("--name", help="object name (default: host-<N>)")
    v.add_argument("--label", action="append", default=[], metavar="K=V", help="label for hostSelector (repeatable)")
    v.add_argument("--description", help="free text for operators")
    v.add_argument("--robot-secret", help="Secret with robot-user/robot-password (default: robot-credentials)")
    v.add_argument("--ssh-secret", help="Secret with ssh-privatekey/ssh-publickey (default: robot-ssh)")

    v = verb("inspect", "ask the host controller to inspect the host again (refuses a consumed host)", run_inspect)
    v.add_argument("name")

    v = verb("maintenance", "take a host out of the pool (--on) or give it back (--off)", run_maintenance)
    v.add_argument("name")
    mode = v.add_mutually_exclusive_group(required=True)
    mode.add_argument("--on", dest="maintenance", action="store_true", default=None)
    mode.add_argument("--off", dest="maintenance", action="store_false")

    v = verb("retire", "never use the host again: sets retired and maintenanceMode", run_retire)
    v.add_argument("name")
    v.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    v.add_argument("--force", action="store_true", help="retire even while a Machine uses the host")

    w = verbs.add_parser("watch", help="the live scale-up view: state, step, time in step, node, GPUReady, Events")
    kubeargs.add_kube_args(w)
    w.add_argument("--cluster", help="only hosts a Machine of this CAPI Cluster consumes")
    w.add_argument("--interval", type=float, default=2.0, help="seconds between looks (default 2)")
    w.add_argument("--timeout", type=float, default=0, help="stop after this many seconds (default: Ctrl-C)")
    w.set_defaults(func=kubeargs.guarded(run_watch))

    hosts_order.register_order(verbs)


# --- reading -------------------------------------------------------------------------------------------


def host_row(obj: Mapping[str, Any]) -> dict[str, Any]:
    """One host as the table and the JSON output show it."""
    meta, spec, status = (as_map(obj.get(k)) for k in ("metadata", "spec", "status"))
    gpus = as_map(status.get("hardware")).get("gpus") or []
    ready = next((c.get("status") for c in status.get("conditions") or [] if as_map(c).get("type") == "Ready"), None)
    flags = [
        flag
        for flag, on in (
            ("maintenance", spec.get("maintenanceMode")),
            ("retired", spec.get("retired")),
            ("standby", spec.get("standby") is not None),
            ("reinspect", domain.ANNOTATION_REINSPECT in as_map(meta.get("annotations"))),
        )
        if on
    ]
    return {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "server": spec.get("serverNumber"),
        "state": status.get("state"),
        "step": status.get("step"),
        "gpu": (as_map(gpus[0]).get("model") or None) if gpus else None,
        "layout": status.get("layout"),
        "consumer": as_map(spec.get("consumerRef")).get("name"),
        "ready": ready,
        "error": status.get("errorType"),
        "flags": flags,
    }


def _emit(rows: list[dict[str, Any]], output: str, *, with_namespace: bool = False, single: bool = False) -> None:
    if output == "json":
        kubeargs.print_json(rows[0] if single else rows)
        return
    columns = ("namespace", *COLUMNS) if with_namespace else COLUMNS
    kubeargs.print_table(columns, [[_show(r[c]) for c in columns] for r in rows])


def _show(value: object) -> object:
    return ",".join(str(v) for v in value) if isinstance(value, list) else value


def run_list(args: argparse.Namespace) -> int:
    ns = kubeargs.namespace(args)
    k = kubeargs.connect(args)
    try:
        items = k.list(HOSTS, ns)
    finally:
        k.close()
    rows = sorted((host_row(i) for i in items), key=lambda r: (r["namespace"] or "", r["name"] or ""))
    if args.output == "table" and not rows:
        print(f"no hosts in {'any namespace' if ns is None else ns}", file=sys.stderr)
        return EXIT_OK
    _emit(rows, args.output, with_namespace=ns is None)
    return EXIT_OK


def run_watch(args: argparse.Namespace) -> int:
    """Redraw the live view until Ctrl-C or ``--timeout`` (bounded: one look per ``--interval``)."""
    if args.interval <= 0 or args.timeout < 0:
        raise CliFailure("--interval must be positive and --timeout not negative", EXIT_USAGE)
    ns = kubeargs.namespace(args) or "default"
    k = kubeargs.connect(args)
    title = f"hosts of cluster {args.cluster} in {ns}" if args.cluster else f"hosts in {ns}"
    deadline = time.monotonic() + args.timeout if args.timeout else None
    try:
        with live.View(title=title) as view:
            while True:
                view.show(live.read(k, ns, args.cluster))
                if deadline is not None and time.monotonic() + args.interval > deadline:
                    break
                time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    finally:
        k.close()
    return EXIT_OK


# --- register ------------------------------------------------------------------------------------------


def _labels(pairs: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliFailure(f"--label {pair!r} is not KEY=VALUE", EXIT_USAGE)
        labels[key] = value
    return labels


def build_host(args: argparse.Namespace, namespace: str) -> dict[str, Any]:
    """The HetznerGPUHost to create, validated by the model."""
    robot: dict[str, Any] = {
        field: value
        for field, value in (
            ("credentials_secret", args.robot_secret),
            ("ssh_key_secret", args.ssh_secret),
        )
        if value is not None
    }
    metadata: dict[str, object] = {"name": args.name or f"host-{args.server}", "namespace": namespace}
    if labels := _labels(args.label):
        metadata["labels"] = labels
    try:
        spec = HetznerGPUHostSpec(server_number=args.server, robot=RobotAccess(**robot), description=args.description)
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise CliFailure(f"invalid host: {problems}", EXIT_USAGE) from exc
    doc = HetznerGPUHost(metadata=metadata, spec=spec).wire()
    doc.pop("status", None)  # the controller owns status; the apiserver would drop it anyway
    return doc


def _warn_missing_secrets(k: kube.Kube, namespace: str, spec: Mapping[str, Any]) -> None:
    robot = as_map(spec.get("robot"))
    for flag, key in (("--robot-secret", "credentialsSecret"), ("--ssh-secret", "sshKeySecret")):
        name = robot.get(key)
        try:
            missing = name is not None and k.get_or_none(kube.SECRETS, str(name), namespace) is None
        except kube.Forbidden:
            return  # allowed to manage hosts but not to read Secrets: nothing to say
        if missing:
            print(f"warning: Secret {namespace}/{name} ({flag}) does not exist yet", file=sys.stderr)


def run_register(args: argparse.Namespace) -> int:
    ns = kubeargs.namespace(args) or "default"
    doc = build_host(args, ns)
    k = kubeargs.connect(args)
    try:
        for other in k.list(HOSTS, ns):
            if as_map(other.get("spec")).get("serverNumber") == args.server:
                name = as_map(other.get("metadata")).get("name")
                raise CliFailure(f"server {args.server} is already registered in {ns} as {name}")
        try:
            created = k.create(HOSTS, doc, ns)
        except kube.Conflict as exc:
            raise CliFailure(f"hetznergpuhost {ns}/{doc['metadata']['name']} already exists") from exc
        _warn_missing_secrets(k, ns, doc["spec"])
    finally:
        k.close()
    _emit([host_row(created)], args.output, single=True)
    return EXIT_OK


# --- changes to one host -------------------------------------------------------------------------------

Decide = Callable[[dict[str, Any], HetznerGPUHostSpec], dict[str, Any] | None]


def _spec_patch(spec: HetznerGPUHostSpec, **changes: Any) -> dict[str, Any]:
    """The ``spec`` part of a merge patch, in wire names, from model fields (validated)."""
    wire = HetznerGPUHostSpec.model_validate({**spec.model_dump(), **changes}).wire()
    aliases = [HetznerGPUHostSpec.model_fields[field].alias or field for field in changes]
    return {alias: wire.get(alias) for alias in aliases}


def _change(args: argparse.Namespace, decide: Decide) -> int:
    """Read the host, let ``decide`` refuse or return a patch, apply it guarded by resourceVersion."""
    ns = kubeargs.namespace(args) or "default"
    k = kubeargs.connect(args)
    try:
        for _ in range(_PATCH_ATTEMPTS):
            obj = k.get_or_none(HOSTS, args.name, ns)
            if obj is None:
                raise CliFailure(f"hetznergpuhost {ns}/{args.name} not found")
            try:
                spec = HetznerGPUHostSpec.model_validate(obj.get("spec") or {})
            except pydantic.ValidationError as exc:
                raise CliFailure(f"hetznergpuhost {ns}/{args.name} has a spec this version cannot read") from exc
            patch = decide(obj, spec)
            if patch is None:
                break
            patch.setdefault("metadata", {})["resourceVersion"] = obj["metadata"]["resourceVersion"]
            try:
                obj = k.patch(HOSTS, args.name, patch, ns)
                break
            except kube.Conflict:
                continue  # changed since we read it: decide again on the new version
        else:
            raise CliFailure(f"hetznergpuhost {ns}/{args.name} kept changing; try again", EXIT_EXTERNAL)
    finally:
        k.close()
    _emit([host_row(obj)], args.output, single=True)
    return EXIT_OK


def _consumer(spec: HetznerGPUHostSpec) -> str | None:
    ref = spec.consumer_ref
    return None if ref is None else f"{ref.kind} {ref.namespace + '/' if ref.namespace else ''}{ref.name}"


def run_inspect(args: argparse.Namespace) -> int:
    def decide(obj: dict[str, Any], spec: HetznerGPUHostSpec) -> dict[str, Any]:
        if (consumer := _consumer(spec)) is not None:
            raise CliFailure(f"{args.name} is in use by {consumer}; inspection would reboot it into rescue")
        requested = base.utcnow().isoformat().replace("+00:00", "Z")
        return {"metadata": {"annotations": {domain.ANNOTATION_REINSPECT: requested}}}

    return _change(args, decide)


def run_maintenance(args: argparse.Namespace) -> int:
    def decide(obj: dict[str, Any], spec: HetznerGPUHostSpec) -> dict[str, Any] | None:
        if spec.maintenance_mode == args.maintenance:
            print(f"{args.name}: maintenance already {'on' if args.maintenance else 'off'}", file=sys.stderr)
            return None
        if args.maintenance and (consumer := _consumer(spec)) is not None:
            print(f"warning: {args.name} is in use by {consumer}; its Machine will be remediated", file=sys.stderr)
        if not args.maintenance and spec.retired:
            print(f"warning: {args.name} is retired and stays out of the pool", file=sys.stderr)
        return {"spec": _spec_patch(spec, maintenance_mode=args.maintenance)}

    return _change(args, decide)


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(f"{question} [y/N] ").strip().lower() in {"y", "yes"}


def run_retire(args: argparse.Namespace) -> int:
    def decide(obj: dict[str, Any], spec: HetznerGPUHostSpec) -> dict[str, Any] | None:
        if spec.retired and spec.maintenance_mode:
            print(f"{args.name}: already retired", file=sys.stderr)
            return None
        consumer = _consumer(spec)
        if consumer is not None and not args.force:
            raise CliFailure(f"{args.name} is in use by {consumer}; pass --force to retire it anyway")
        question = f"retire {args.name} (server {spec.server_number})? It will never be chosen again"
        if not args.yes and not _confirm(question):
            raise CliFailure("not confirmed: pass --yes to retire without a prompt", EXIT_USAGE)
        args.yes = True  # asked once: a retry after a 409 decides again without asking again
        if consumer is not None:
            print(f"warning: {args.name} is in use by {consumer}; its Machine will be remediated", file=sys.stderr)
        return {"spec": _spec_patch(spec, retired=True, maintenance_mode=True)}

    return _change(args, decide)
