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

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_EXTERNAL = 3

# Subcommand modules; a missing one is a packaging bug, not a runtime choice.
SUBCOMMANDS = ("run", "crds", "layouts", "sim", "dev", "hosts", "nodes", "cost", "autoscaler", "gate_plugin")
# These drive capi_gpu.sim, which the wheel and the image leave out (a source checkout has it).
NEEDS_SIM = frozenset({"sim", "dev"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capi-gpu", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    with_sim = importlib.util.find_spec("capi_gpu.sim") is not None
    for name in SUBCOMMANDS:
        if name in NEEDS_SIM and not with_sim:
            continue
        try:
            module = importlib.import_module(f"capi_gpu.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"capi_gpu.cli.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
