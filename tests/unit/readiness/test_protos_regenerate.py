"""Committed kubelet gRPC bindings equal a fresh hack/gen-protos.sh run from the pinned k8s.io/kubelet."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
PROTO = pathlib.PurePosixPath("capi_gpu/readiness/proto")


def test_regenerating_yields_the_committed_files(tmp_path: pathlib.Path) -> None:
    run = subprocess.run(
        [str(ROOT / "hack/gen-protos.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert run.returncode == 0, run.stderr
    fresh = {p.name: p.read_bytes() for p in (tmp_path / PROTO).iterdir()}
    committed = {p.name: p.read_bytes() for p in (ROOT / PROTO).iterdir() if p.name in fresh}
    assert sorted(fresh) == [
        "dra_v1.proto",
        "dra_v1_pb2.py",
        "dra_v1_pb2.pyi",
        "dra_v1_pb2_grpc.py",
        "pluginregistration_v1.proto",
        "pluginregistration_v1_pb2.py",
        "pluginregistration_v1_pb2.pyi",
        "pluginregistration_v1_pb2_grpc.py",
    ]
    stale = sorted(name for name in fresh if committed.get(name) != fresh[name])
    assert not stale, f"{stale} differ from a fresh generation: run hack/gen-protos.sh and commit"


def test_services_keep_the_names_the_kubelet_dials() -> None:
    from capi_gpu.readiness.proto import dra_v1_pb2, pluginregistration_v1_pb2

    assert dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    registration = pluginregistration_v1_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert registration.full_name == "pluginregistration.Registration"
