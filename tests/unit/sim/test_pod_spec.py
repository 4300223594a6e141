"""The pod runner's reading of a manifest, as the kubelet reads it: $(VAR) expansion, env sources, the image's
entry point against command/args, volume files, probe defaults; and the AtomicWriter layout of a volume."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from capi_gpu_sim.pods import images, podspec, volumes

FACTS = podspec.PodFacts("p-1", "capi-gpu-system", "uid-1", "127.65.1.2", "mgmt", "sa", {"app": "x"})


@pytest.mark.parametrize(
    ("text", "env", "want"),
    [
        (
            "--liveness=http://$(POD_IP):8080/healthz",
            {"POD_IP": "127.65.1.2"},
            "--liveness=http://127.65.1.2:8080/healthz",
        ),
        ("$(UNSET) stays", {}, "$(UNSET) stays"),
        ("$$(POD_IP) is escaped", {"POD_IP": "x"}, "$(POD_IP) is escaped"),
        ("${CLUSTERCTL} is not ours", {"CLUSTERCTL": "x"}, "${CLUSTERCTL} is not ours"),
    ],
)
def test_expand(text: str, env: dict[str, str], want: str) -> None:
    assert podspec.expand(text, env) == want


def test_environment_in_manifest_order_with_the_downward_api_and_keys() -> None:
    container: dict[str, Any] = {
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "URL", "value": "http://$(POD_IP):1"},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "gone", "optional": True}}},
        ]
    }
    found = {("Secret", "s", "k"): "hunter2"}
    env = podspec.environment(container, FACTS, lambda *k: found.get(k), ("10.0.0.1", 443))
    assert env == {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "POD_IP": "127.65.1.2",
        "URL": "http://127.65.1.2:1",
        "NS": "capi-gpu-system",
        "PW": "hunter2",
    }
    with pytest.raises(podspec.SpecError, match="no key"):
        podspec.environment(
            {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "no"}}}]},
            FACTS,
            lambda *k: None,
            ("h", 1),
        )


@pytest.mark.parametrize(
    ("container", "want"),
    [
        ({}, ["capi-gpu", "run"]),  # the image's ENTRYPOINT and CMD
        ({"args": ["run", "--leader-elect"]}, ["capi-gpu", "run", "--leader-elect"]),  # args replace CMD
        ({"command": ["/manager"], "args": ["--x"]}, ["/manager", "--x"]),  # command replaces both
        ({"args": []}, ["capi-gpu"]),  # an explicit empty args drops CMD
    ],
)
def test_argv(container: dict[str, Any], want: list[str]) -> None:
    assert podspec.argv(container, ["capi-gpu"], ["run"], {}) == want


def test_images_map_any_registry_of_ours_and_in_image_paths() -> None:
    table = {"ghcr.io/capi-gpu/capi-gpu": lambda: images.Entry(["/venv/capi-gpu"], ["run"])}
    assert images.resolve("example.invalid/mirror/capi-gpu:v9@sha256:ab", table).entrypoint == ["/venv/capi-gpu"]
    with pytest.raises(images.UnknownImage):
        images.resolve("quay.io/other/thing:1", table)
    entry = images.Entry(["/bin/manager"], paths={"/manager": "/bin/manager"})
    assert images.program(["/manager", "--a"], entry) == ["/bin/manager", "--a"]
    assert images.repository("registry:5000/a/b:tag") == "registry:5000/a/b"


def test_mounts_add_the_service_account_token_and_put_parents_first() -> None:
    spec: dict[str, Any] = {
        "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "cert", "secret": {"secretName": "c"}}],
    }
    container = {"volumeMounts": [{"name": "cert", "mountPath": "/tmp/certs/x"}, {"name": "tmp", "mountPath": "/tmp"}]}
    got = [(m.volume, m.path) for m in podspec.mounts(container, spec)]
    assert got == [("tmp", "/tmp"), ("cert", "/tmp/certs/x"), ("kube-api-access", podspec.SA_MOUNT)]
    assert podspec.mounts(container, {**spec, "automountServiceAccountToken": False})[-1].volume == "cert"


def test_probe_defaults_and_named_ports() -> None:
    c = {
        "ports": [{"name": "healthz", "containerPort": 8080}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "healthz"}},
    }
    p = podspec.probe(c, "livenessProbe")
    assert p == podspec.Probe("httpGet", 8080, "/healthz", period=10.0, timeout=1.0, failure_threshold=3)
    assert podspec.probe(c, "readinessProbe") is None


def test_atomic_write_swaps_data_in_one_rename(tmp_path: Path) -> None:
    d = tmp_path / "vol"
    assert volumes.write_atomic(d, {"tls.crt": "A", "tls.key": "a"})
    first = os.stat(d / "tls.crt").st_ino
    assert not volumes.write_atomic(d, {"tls.crt": "A", "tls.key": "a"}), "unchanged: nothing written"
    assert volumes.write_atomic(d, {"tls.crt": "B"})
    assert (d / "tls.crt").read_text() == "B" and os.stat(d / "tls.crt").st_ino != first
    assert not (d / "tls.key").exists(), "a key that left the Secret leaves the volume"
    assert os.readlink(d / "tls.crt") == "..data/tls.crt"
    assert len([p for p in d.iterdir() if p.name.startswith("..") and p.is_dir() and not p.is_symlink()]) == 1
