"""What the kubelet makes of a pod's spec, before any process starts: pure, so it is tested from tables.

A container becomes an argv (its image mapped to a local entry point by ``images``, then ``command`` and
``args`` with ``$(VAR)`` expanded as the kubelet does), an environment (``value``, the downward API's
``fieldRef``, Secret and ConfigMap keys, and the ``KUBERNETES_SERVICE_*`` pair), and mounts: each volume
mount names a host directory the runner fills (emptyDir, Secret, ConfigMap, the ServiceAccount token).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class SpecError(ValueError):
    """The pod asks for something the runner cannot give (a volume kind, a missing key)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined variable is replaced, an undefined one is left as written,
    and ``$$`` is one literal ``$`` (so ``$$(VAR)`` stays ``$(VAR)``)."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _VAR.sub(one, text)


@dataclass(frozen=True)
class PodFacts:
    """What the downward API can hand a container."""

    name: str
    namespace: str
    uid: str
    pod_ip: str
    node_name: str
    service_account: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def field(self, path: str) -> str:
        simple = {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
            "status.podIP": self.pod_ip,
            "status.hostIP": self.pod_ip,
            "spec.nodeName": self.node_name,
            "spec.serviceAccountName": self.service_account,
        }
        if path in simple:
            return simple[path]
        m = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
        if m:
            return self.labels.get(m.group(1), "")
        raise SpecError(f"fieldRef {path!r} is not one the runner supports")


KeyLookup = Callable[[str, str, str], str | None]
"""(kind "Secret"|"ConfigMap", name, key) -> value, or None when absent."""


def environment(
    container: Mapping[str, Any], facts: PodFacts, lookup: KeyLookup, api: tuple[str, int]
) -> dict[str, str]:
    """The container's environment in manifest order; later entries may ``$(...)`` earlier ones."""
    env: dict[str, str] = {"KUBERNETES_SERVICE_HOST": api[0], "KUBERNETES_SERVICE_PORT": str(api[1])}
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" not in item:
            env[name] = expand(str(item.get("value", "")), env)
            continue
        src = item["valueFrom"]
        if "fieldRef" in src:
            env[name] = facts.field(src["fieldRef"]["fieldPath"])
            continue
        for kind, key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
            if key in src:
                ref = src[key]
                value = lookup(kind, ref["name"], ref["key"])
                if value is None and not ref.get("optional"):
                    raise SpecError(f"env {name}: {kind} {ref['name']} has no key {ref['key']}")
                if value is not None:
                    env[name] = value
                break
        else:
            raise SpecError(f"env {name}: valueFrom {sorted(src)} is not one the runner supports")
    return env


def argv(
    container: Mapping[str, Any], entrypoint: list[str], default_args: list[str], env: Mapping[str, str]
) -> list[str]:
    """``command`` replaces the image's entrypoint (and drops its default args); ``args`` replace the defaults."""
    command = [expand(str(c), env) for c in container.get("command") or []]
    args = [expand(str(a), env) for a in container.get("args") or []]
    if command:
        return [*command, *args]
    return [*entrypoint, *(args if "args" in container else default_args)]


@dataclass(frozen=True)
class Volume:
    name: str
    kind: str  # emptyDir | secret | configMap | serviceAccountToken
    source: str = ""  # the Secret's or ConfigMap's name
    items: tuple[tuple[str, str], ...] = ()  # (key, path); empty: every key
    optional: bool = False


@dataclass(frozen=True)
class Mount:
    volume: str
    path: str
    read_only: bool
    sub_path: str = ""


def volumes(pod_spec: Mapping[str, Any]) -> dict[str, Volume]:
    out: dict[str, Volume] = {}
    for v in pod_spec.get("volumes") or []:
        name = v["name"]
        if "emptyDir" in v:
            out[name] = Volume(name, "emptyDir")
        elif "secret" in v:
            s = v["secret"]
            items = tuple((i["key"], i["path"]) for i in s.get("items") or [])
            out[name] = Volume(name, "secret", s["secretName"], items, bool(s.get("optional")))
        elif "configMap" in v:
            c = v["configMap"]
            items = tuple((i["key"], i["path"]) for i in c.get("items") or [])
            out[name] = Volume(name, "configMap", c["name"], items, bool(c.get("optional")))
        else:
            raise SpecError(f"volume {name}: only emptyDir, secret and configMap are supported")
    return out


def mounts(container: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> list[Mount]:
    """The container's mounts, parents before children, plus the ServiceAccount token the kubelet adds
    (the ServiceAccount admission plugin would add it as a projected volume; the test apiserver runs
    without that plugin, so the runner adds it unless the pod opts out)."""
    found = [
        Mount(m["name"], m["mountPath"], bool(m.get("readOnly")), m.get("subPath", ""))
        for m in container.get("volumeMounts") or []
    ]
    known = volumes(pod_spec)
    for m in found:
        if m.volume not in known:
            raise SpecError(f"volumeMount {m.path}: no volume named {m.volume}")
    if pod_spec.get("automountServiceAccountToken", True) and not any(m.path == SA_MOUNT for m in found):
        found.append(Mount("kube-api-access", SA_MOUNT, True))
    return sorted(found, key=lambda m: m.path.count("/"))


def files_for(volume: Volume, data: Mapping[str, str]) -> dict[str, str]:
    """A Secret's or ConfigMap's keys as the files the kubelet writes (``items`` select and rename)."""
    if not volume.items:
        return dict(data)
    out: dict[str, str] = {}
    for key, path in volume.items:
        if key not in data:
            if volume.optional:
                continue
            raise SpecError(f"volume {volume.name}: {volume.kind} {volume.source} has no key {key}")
        out[path] = data[key]
    return out


@dataclass(frozen=True)
class Probe:
    kind: str  # httpGet | tcpSocket | exec
    port: int = 0
    path: str = "/"
    scheme: str = "HTTP"
    host: str = ""
    command: tuple[str, ...] = ()
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    failure_threshold: int = 3
    success_threshold: int = 1


def port_number(port: int | str, container: Mapping[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise SpecError(f"no container port named {port!r}")


def probe(container: Mapping[str, Any], which: str) -> Probe | None:
    """``which``: livenessProbe, readinessProbe or startupProbe, with Kubernetes' defaults."""
    p = container.get(which)
    if not p:
        return None
    common = {
        "initial_delay": float(p.get("initialDelaySeconds", 0)),
        "period": float(p.get("periodSeconds", 10)),
        "timeout": float(p.get("timeoutSeconds", 1)),
        "failure_threshold": int(p.get("failureThreshold", 3)),
        "success_threshold": int(p.get("successThreshold", 1)),
    }
    if "httpGet" in p:
        h = p["httpGet"]
        return Probe(
            "httpGet",
            port_number(h["port"], container),
            h.get("path", "/"),
            h.get("scheme", "HTTP"),
            h.get("host", ""),
            **common,  # type: ignore[arg-type]
        )
    if "tcpSocket" in p:
        return Probe("tcpSocket", port_number(p["tcpSocket"]["port"], container), **common)  # type: ignore[arg-type]
    if "exec" in p:
        return Probe("exec", command=tuple(p["exec"]["command"]), **common)  # type: ignore[arg-type]
    raise SpecError(f"{which}: only httpGet, tcpSocket and exec are supported")
