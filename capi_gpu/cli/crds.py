"""`capi-gpu crds`: write or check the generated CRD YAML."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from capi_gpu.api import crdgen
from capi_gpu.cli import EXIT_FAILED, EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("crds", help="generate crds/*.yaml from the pydantic models")
    p.add_argument("--out", type=Path, default=Path("crds"), help="output directory (default crds/)")
    p.add_argument("--check", action="store_true", help="exit 1 if the directory differs from the models")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.check:
        problems = crdgen.check(args.out)
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("CRDs are out of date: run `capi-gpu crds`", file=sys.stderr)
            return EXIT_FAILED
        print(f"{args.out}: up to date")
        return EXIT_OK
    for path in crdgen.write(args.out):
        print(path)
    return EXIT_OK
