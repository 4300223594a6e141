"""The kubeadm shim reads join configuration like kubeadm: v1beta4 list and v1beta3 map kubeletExtraArgs,
node name, taints, labels, provider-id; refuses mixing --config with flags, missing discovery, unknown
versions, and a second join while kubelet.conf exists; reset -f removes the record and the sentinel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capi_gpu_sim.host_shims import kubeadm

V1BETA4 = """apiVersion: kubeadm.k8s.io/v1beta4
kind: JoinConfiguration
discovery:
  bootstrapToken: {apiServerEndpoint: "10.0.0.1:6443", token: abcdef.0123456789abcdef, caCertHashes: ["sha256:00"]}
nodeRegistration:
  name: BM-Node-1
  taints: [{key: readiness.k8s.io/gpu-not-ready, effect: NoSchedule}]
  kubeletExtraArgs:
  - {name: provider-id, value: "hrobot://321"}
  - {name: node-labels, value: "a=b,node.cluster.x-k8s.io/gpu=true"}
"""


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("JOIN_RECORD", "RESET_RECORD", "KUBELET_CONF", "FLAGS_ENV", "SENTINEL", "HW_PATH"):
        monkeypatch.setattr(kubeadm, name, tmp_path / name.lower())
    return tmp_path


def _join(root: Path, text: str, *flags: str) -> int:
    cfg = root / "join.yaml"
    cfg.write_text(text)
    return kubeadm.main(["join", "--config", str(cfg), *flags])


def test_v1beta4_join_is_recorded_with_the_sentinel(root: Path) -> None:
    assert _join(root, V1BETA4) == 0
    rec = json.loads((root / "join_record").read_text())
    assert rec["nodeName"] == "bm-node-1"
    assert rec["providerID"] == "hrobot://321"
    assert rec["labels"] == {"a": "b", "node.cluster.x-k8s.io/gpu": "true"}
    assert rec["taints"] == [{"key": "readiness.k8s.io/gpu-not-ready", "effect": "NoSchedule"}]
    assert (root / "sentinel").read_text() == "success\n"
    assert "--provider-id=hrobot://321" in (root / "flags_env").read_text()


def test_v1beta3_map_form(root: Path) -> None:
    text = V1BETA4.replace("v1beta4", "v1beta3").replace(
        '  - {name: provider-id, value: "hrobot://321"}\n  - {name: node-labels, value: "a=b,node.cluster.x-k8s.io/gpu=true"}\n',
        '    provider-id: "hrobot://7"\n',
    )
    assert _join(root, text) == 0
    assert json.loads((root / "join_record").read_text())["providerID"] == "hrobot://7"


@pytest.mark.parametrize(
    ("text", "flags", "message"),
    [
        (V1BETA4, ("--token", "x"), "can not mix '--config' with arguments"),
        (V1BETA4.replace("token: abcdef.0123456789abcdef, ", ""), (), "bootstrapToken or file must be set"),
        (V1BETA4.replace("v1beta4", "v1beta2"), (), 'no kind "JoinConfiguration" is registered'),
        (V1BETA4.replace("JoinConfiguration", "InitConfiguration"), (), "no JoinConfiguration kind"),
    ],
)
def test_refusals(
    root: Path, text: str, flags: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _join(root, text, *flags) == 1
    assert message in capsys.readouterr().err
    assert not (root / "join_record").exists()


def test_second_join_is_refused_until_reset(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _join(root, V1BETA4) == 0
    assert _join(root, V1BETA4) == 1
    assert "FileAvailable--etc-kubernetes-kubelet.conf" in capsys.readouterr().err
    assert kubeadm.main(["reset", "-f"]) == 0
    assert not (root / "join_record").exists() and not (root / "sentinel").exists()
    assert json.loads((root / "reset_record").read_text())["previous"]["nodeName"] == "bm-node-1"
    assert _join(root, V1BETA4) == 0
