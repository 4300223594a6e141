"""`kubeadm` for the simulated installed OS: `join` and `reset`, recorded for the simulated kubelet.

Why: a real ``kubeadm join`` needs a kubelet, a container runtime and a reachable apiserver, none of
which exist inside a simulated host (listeners stay on the test machine's loopback). What the provider
must get right is what it hands to kubeadm: the join configuration (v1beta3 map or v1beta4 list
``kubeletExtraArgs``, node name, taints, ``provider-id``, ``node-labels``, discovery), and the order
(join once; reset before re-join). So this parses and validates like kubeadm, refuses a second join
while ``/etc/kubernetes/kubelet.conf`` exists (kubeadm's preflight), and writes a join record
``/var/lib/kubelet/sim-join.json`` that the test-side simulated kubelet (``capi_gpu_sim.kubelet``) turns
into a Node. ``reset -f`` removes it and writes ``/var/lib/kubelet/sim-reset.json``; like the real one it
leaves cloud-init's per-instance record alone (the next bootstrap runs because the next Machine brings a new
instance-id, which the cloud-init stand-in treats as a new instance, as cloud-init does).

It also writes the CAPI sentinel ``/run/cluster-api/bootstrap-success.complete`` after a join (the
simulation brief asks for it; CABPK's runcmd writes it too). The real kubeadm does not: set
``"kubeadm_writes_sentinel": false`` in the host's hardware description to check that bootstrap data
writes it itself.

Like kubeadm's ``kubelet-start`` phase, a join (re)starts ``kubelet.service`` when systemd runs the guest,
and a reset stops it: the simulated kubelet starts the NVIDIA DRA publisher only while that unit is active,
as the real plugin is a pod the kubelet runs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

VERSION = os.environ.get("SIM_KUBEADM_VERSION", "v1.36.3")
JOIN_RECORD = Path("/var/lib/kubelet/sim-join.json")
RESET_RECORD = Path("/var/lib/kubelet/sim-reset.json")
KUBELET_CONF = Path("/etc/kubernetes/kubelet.conf")
FLAGS_ENV = Path("/var/lib/kubelet/kubeadm-flags.env")
SENTINEL = Path("/run/cluster-api/bootstrap-success.complete")
HW_PATH = Path("/run/sim/hw/hardware.json")
# Flags kubeadm allows next to --config for join.
MIXABLE = {"config", "ignore-preflight-errors", "dry-run", "v", "skip-phases", "node-name"}


class KubeadmError(Exception):
    pass


def _parse_flags(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    positional, flags = [], {}
    it = iter(argv)
    for arg in it:
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if not eq:
                boolean = name in ("force", "control-plane", "discovery-token-unsafe-skip-ca-verification", "dry-run")
                value = "true" if boolean else next(it, "")
            flags[name] = value
        elif arg.startswith("-") and len(arg) > 1:
            name = arg[1:]
            key = {"f": "force", "v": "v"}.get(name[0], name)
            flags[key] = "true" if name == "f" else name[1:] or next(it, "")
        else:
            positional.append(arg)
    return positional, flags


def _extra_args(raw: Any) -> dict[str, str]:
    """v1beta4 list ``[{name, value}]`` or v1beta3 map."""
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    if isinstance(raw, list):
        out: dict[str, str] = {}
        for item in raw:
            if not isinstance(item, dict) or "name" not in item:
                raise KubeadmError("kubeletExtraArgs: each entry needs 'name' and 'value'")
            out[str(item["name"])] = str(item.get("value", ""))
        return out
    raise KubeadmError("kubeletExtraArgs: expected a list of {name, value} (v1beta4) or a map (v1beta3)")


def _from_config(path: str) -> dict[str, Any]:
    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
    except (OSError, yaml.YAMLError) as exc:
        raise KubeadmError(f"unable to read config from {path!r}: {exc}") from exc
    join = next((d for d in docs if d.get("kind") == "JoinConfiguration"), None)
    if join is None:
        raise KubeadmError(f"no JoinConfiguration kind was found in the YAML file {path}")
    api = str(join.get("apiVersion", ""))
    if api not in ("kubeadm.k8s.io/v1beta3", "kubeadm.k8s.io/v1beta4"):
        raise KubeadmError(f'no kind "JoinConfiguration" is registered for version "{api}"')
    reg = join.get("nodeRegistration") or {}
    disc = join.get("discovery") or {}
    token = disc.get("bootstrapToken") or {}
    return {
        "name": reg.get("name"),
        "taints": reg.get("taints"),
        "extra": _extra_args(reg.get("kubeletExtraArgs")),
        "criSocket": reg.get("criSocket"),
        "endpoint": token.get("apiServerEndpoint"),
        "discovery": _has_discovery(token, disc),
        "apiVersion": api,
    }


def _has_discovery(token: dict[str, Any], disc: dict[str, Any]) -> bool:
    pinned = bool(token.get("caCertHashes") or token.get("unsafeSkipCAVerification"))
    return (bool(token.get("token")) and pinned) or bool(disc.get("file"))


def _from_flags(positional: list[str], flags: dict[str, str]) -> dict[str, Any]:
    return {
        "name": flags.get("node-name"),
        "taints": None,
        "extra": {},
        "criSocket": flags.get("cri-socket"),
        "endpoint": positional[0] if positional else None,
        "discovery": _has_discovery(
            {
                "token": flags.get("token") or flags.get("discovery-token"),
                "caCertHashes": flags.get("discovery-token-ca-cert-hash"),
                "unsafeSkipCAVerification": "discovery-token-unsafe-skip-ca-verification" in flags,
            },
            {"file": flags.get("discovery-file")},
        ),
        "apiVersion": None,
    }


def _labels(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise KubeadmError(f"invalid node label {item!r}")
        out[key] = value
    return out


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _kubelet(action: str) -> None:
    """``systemctl <action> kubelet`` as kubeadm's init-system helper does; only inside a simulated host
    (its hardware description is there) run by systemd, never on the machine running a unit test."""
    if not (HW_PATH.exists() and Path("/run/systemd/system").is_dir()):
        return
    subprocess.run(["systemctl", action, "--no-block", "kubelet.service"], check=False, capture_output=True, timeout=60)


def join(positional: list[str], flags: dict[str, str]) -> int:
    if "config" in flags:
        mixed = sorted(set(flags) - MIXABLE)
        if mixed or positional:
            raise KubeadmError(f"can not mix '--config' with arguments {mixed + positional}")
        spec = _from_config(flags["config"])
    else:
        spec = _from_flags(positional, flags)
    if flags.get("node-name"):
        spec["name"] = flags["node-name"]
    if not spec["discovery"]:
        raise KubeadmError('discovery: Invalid value: "": bootstrapToken or file must be set')
    ignored = {s.strip().lower() for s in flags.get("ignore-preflight-errors", "").split(",")}
    if KUBELET_CONF.exists() and not ({"all", "fileavailable--etc-kubernetes-kubelet.conf"} & ignored):
        raise KubeadmError(
            "[preflight] Some fatal errors occurred:\n\t[ERROR FileAvailable--etc-kubernetes-"
            "kubelet.conf]: /etc/kubernetes/kubelet.conf already exists"
        )
    name = (spec["name"] or socket.gethostname()).lower()
    extra = spec["extra"]
    record = {
        "nodeName": name,
        "providerID": extra.get("provider-id", ""),
        "labels": _labels(extra.get("node-labels", "")),
        "taints": spec["taints"] if spec["taints"] is not None else [],
        "kubeletExtraArgs": extra,
        "apiServerEndpoint": spec["endpoint"],
        "configApiVersion": spec["apiVersion"],
        "bootID": _boot_id(),
        "joinedAt": time.time(),
    }
    KUBELET_CONF.parent.mkdir(parents=True, exist_ok=True)
    KUBELET_CONF.write_text("# simulated kubelet.conf; the simulated kubelet runs outside this host\n")
    JOIN_RECORD.parent.mkdir(parents=True, exist_ok=True)
    args = " ".join(f"--{k}={v}" for k, v in extra.items())
    FLAGS_ENV.write_text(f'KUBELET_KUBEADM_ARGS="{args}"\n')
    RESET_RECORD.unlink(missing_ok=True)
    tmp = JOIN_RECORD.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(JOIN_RECORD)
    _kubelet("restart")
    if _writes_sentinel():
        SENTINEL.parent.mkdir(parents=True, exist_ok=True)
        SENTINEL.write_text("success\n")
    print(
        "This node has joined the cluster:\n* Certificate signing request was sent to apiserver and a "
        "response was received.\n* The Kubelet was informed of the new secure connection details."
    )
    return 0


def _writes_sentinel() -> bool:
    try:
        return bool(json.loads(HW_PATH.read_text()).get("kubeadm_writes_sentinel", True))
    except (OSError, ValueError):
        return True


def reset(flags: dict[str, str]) -> int:
    if flags.get("force") != "true":
        print("[reset] Are you sure you want to proceed? [y/N]: ", end="", flush=True)
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            raise KubeadmError("won't proceed; the user didn't answer (Y|n) in order to continue")
    _kubelet("stop")
    previous = json.loads(JOIN_RECORD.read_text()) if JOIN_RECORD.exists() else None
    for path in (JOIN_RECORD, KUBELET_CONF, FLAGS_ENV, SENTINEL):
        path.unlink(missing_ok=True)
    RESET_RECORD.parent.mkdir(parents=True, exist_ok=True)
    RESET_RECORD.write_text(json.dumps({"resetAt": time.time(), "previous": previous, "bootID": _boot_id()}))
    print(
        "[reset] Deleted contents of the etcd data directory: skipped (worker)\n[reset] The reset process "
        "does not clean CNI configuration or iptables rules."
    )
    return 0


def main(argv: list[str]) -> int:
    positional, flags = _parse_flags(argv[1:]) if argv else ([], {})
    cmd = argv[0] if argv else ""
    try:
        if cmd == "version":
            print(
                VERSION
                if flags.get("o") == "short" or flags.get("output") == "short"
                else f'kubeadm version: &version.Info{{GitVersion:"{VERSION}"}}'
            )
            return 0
        if cmd == "join":
            return join(positional, flags)
        if cmd == "reset":
            return reset(flags)
    except KubeadmError as exc:
        print(f"error execution phase: {exc}" if cmd == "join" else f"error: {exc}", file=sys.stderr)
        return 1
    print(f"kubeadm (simulated): unsupported command {cmd!r}; supported: join, reset, version", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
