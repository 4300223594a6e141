"""`capi-gpu`: the operator entry point and the ops tools around it.

Each subcommand lives in its own module under ``capi_gpu.cli`` and exposes ``register(subparsers)``;
this module only wires them. Exit codes scripts can rely on: 0 success, 1 the check failed or the
thing is not ready, 2 usage or input error, 3 an external system refused.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_EXTERNAL = 3

# Subcommand modules; a missing one is a packaging bug, not a runtime choice.
SUBCOMMANDS = ("run", "crds", "layouts", "hosts", "image", "nodes", "cost", "autoscaler", "gate_plugin")
# The simulators and their subcommands live in the top-level package ``capi_gpu_sim``: beside this package
# in a source checkout, in neither the wheel nor the image. Product code never imports it (import-linter);
# the CLI only looks it up by name, so an installed operator simply has no ``sim``/``dev``.
SIM_PACKAGE = "capi_gpu_sim"
NEEDS_SIM = frozenset({"sim", "dev"})


def _sim_cli() -> ModuleType | None:
    if importlib.util.find_spec(SIM_PACKAGE) is None:
        # The editable install maps only ``capi_gpu``; its checkout is two levels up from this file.
        checkout = Path(__file__).resolve().parents[2]
        if not (checkout / SIM_PACKAGE / "__init__.py").is_file():
            return None
        sys.path.append(str(checkout))  # appended: never shadows anything installed
    try:
        importlib.import_module(SIM_PACKAGE)
        return importlib.import_module(f"{SIM_PACKAGE}.cli")
    except ImportError as exc:
        if exc.name not in (SIM_PACKAGE, f"{SIM_PACKAGE}.cli"):
            raise
        return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capi-gpu", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"capi_gpu.cli.{name}").register(sub)
    sim_cli = _sim_cli()
    if sim_cli is not None:
        sim_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
