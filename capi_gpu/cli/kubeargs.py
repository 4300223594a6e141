"""The kubectl-like flags the cluster-facing subcommands share, and the one place their errors map to exit codes.

Ops scripts chain ``capi-gpu hosts ...`` and ``kubectl`` against the same cluster, so the flags
mean what kubectl's mean: ``--kubeconfig`` (else ``$KUBECONFIG``, else ``~/.kube/config``),
``-n`` (else the context's namespace, else ``default``), ``-A`` for every namespace. Errors reach
the caller as exit codes they can branch on: a missing object or a refusal is 1, a bad flag or a
kubeconfig that cannot be read is 2, an apiserver that is unreachable or answers with an error is 3.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import kubernetes.config
import urllib3.exceptions

from capi_gpu import kube
from capi_gpu.cli import EXIT_EXTERNAL, EXIT_FAILED, EXIT_USAGE


class CliFailure(Exception):
    """Stop the command with a message on stderr and an exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def add_kube_args(parser: argparse.ArgumentParser, *, all_namespaces: bool = False) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    if all_namespaces:
        scope = parser.add_mutually_exclusive_group()
        scope.add_argument("-n", "--namespace", help="namespace (default: the context's, else default)")
        scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    else:
        parser.add_argument("-n", "--namespace", help="namespace (default: the context's, else default)")


def add_output_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format")


def connect(args: argparse.Namespace) -> kube.Kube:
    try:
        return kube.Kube.from_kubeconfig(args.kubeconfig, args.context)
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise CliFailure(f"cannot load kubeconfig: {exc}", EXIT_USAGE) from exc


def namespace(args: argparse.Namespace) -> str | None:
    """The namespace to act in; None when ``-A`` asks for all of them."""
    if getattr(args, "all_namespaces", False):
        return None
    if args.namespace:
        return str(args.namespace)
    try:
        _, active = kubernetes.config.list_kube_config_contexts(config_file=args.kubeconfig)
    except (kubernetes.config.ConfigException, OSError):
        return "default"
    if args.context:
        contexts, _ = kubernetes.config.list_kube_config_contexts(config_file=args.kubeconfig)
        active = next((c for c in contexts if c.get("name") == args.context), active)
    ns = (active or {}).get("context", {}).get("namespace")
    return str(ns) if ns else "default"


def guarded(body: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a subcommand body, turning failures into a message on stderr and an exit code."""

    def run(args: argparse.Namespace) -> int:
        try:
            return body(args)
        except CliFailure as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.code
        except kube.NotFound as exc:
            print(f"error: not found: {exc.message}", file=sys.stderr)
            return EXIT_FAILED
        except kube.Invalid as exc:
            print(f"error: the apiserver rejected the object: {exc.message}", file=sys.stderr)
            return EXIT_USAGE
        except kube.KubeError as exc:
            print(f"error: apiserver: {exc}", file=sys.stderr)
            return EXIT_EXTERNAL
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            print(f"error: cannot reach the apiserver: {exc}", file=sys.stderr)
            return EXIT_EXTERNAL

    return run


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """kubectl-style columns: upper-case headers, two spaces apart, ``<none>`` for empty cells."""
    cells = [[str(h).upper() for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for row in cells:
        print("   ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _cell(value: object) -> str:
    if value is None or value == "":
        return "<none>"
    return str(value)


def print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2, sort_keys=False))
