"""`kubeargs.namespace`: kubectl's order without an apiserver. ``-n`` wins, ``-A`` means all (None), else
the namespace of the context in use (``--context``, else the current one) of ``--kubeconfig``, else of
``$KUBECONFIG``, else ``default`` (also when the kubeconfig cannot be read)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import kubernetes.config.kube_config
import pytest
import yaml

from capi_gpu.cli import kubeargs


def context(name: str, namespace: str | None) -> dict[str, Any]:
    ctx: dict[str, str] = {"cluster": "local", "user": "admin"}
    if namespace:
        ctx["namespace"] = namespace
    return {"name": name, "context": ctx}


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "config"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "dev",
        "clusters": [{"name": "local", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "admin", "user": {"token": "t"}}],
        "contexts": [context("dev", "gpu"), context("other", "ops"), context("bare", None)],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    kubeargs.add_kube_args(parser, all_namespaces=True)
    return parser.parse_args(list(argv))


def test_the_current_contexts_namespace_when_no_flag(kubeconfig: Path) -> None:
    assert kubeargs.namespace(parse("--kubeconfig", str(kubeconfig))) == "gpu"


def test_the_named_contexts_namespace_else_default(kubeconfig: Path) -> None:
    assert kubeargs.namespace(parse("--kubeconfig", str(kubeconfig), "--context", "other")) == "ops"
    assert kubeargs.namespace(parse("--kubeconfig", str(kubeconfig), "--context", "bare")) == "default"


def test_the_flag_wins_and_all_namespaces_is_none(kubeconfig: Path) -> None:
    assert kubeargs.namespace(parse("--kubeconfig", str(kubeconfig), "-n", "x")) == "x"
    assert kubeargs.namespace(parse("--kubeconfig", str(kubeconfig), "-A")) is None


def test_from_the_default_kubeconfig_when_no_kubeconfig_flag(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The client reads $KUBECONFIG once, at import, into this default (as for a CLI started with it set).
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    assert kubeargs.namespace(parse()) == "gpu"


def test_default_when_the_kubeconfig_is_missing(tmp_path: Path) -> None:
    assert kubeargs.namespace(parse("--kubeconfig", str(tmp_path / "absent"))) == "default"
