"""One probe attempt, as the kubelet makes it: HTTP(S) GET (2xx/3xx passes, TLS unverified), TCP connect,
or a command (exit 0 passes). Every attempt is bounded by the probe's timeoutSeconds."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Mapping

import httpx

from capi_gpu_sim.pods.podspec import Probe


def attempt(probe: Probe, pod_ip: str, env: Mapping[str, str] | None = None) -> bool:
    host = probe.host or pod_ip
    try:
        if probe.kind == "httpGet":
            url = f"{probe.scheme.lower()}://{host}:{probe.port}{probe.path}"
            answer = httpx.get(url, timeout=probe.timeout, verify=False, follow_redirects=False)
            return 200 <= answer.status_code < 400
        if probe.kind == "tcpSocket":
            with socket.create_connection((host, probe.port), timeout=probe.timeout):
                return True
        if probe.kind == "exec":
            done = subprocess.run(
                list(probe.command), capture_output=True, timeout=probe.timeout, check=False, env=dict(env or {})
            )
            return done.returncode == 0
    except (httpx.HTTPError, OSError, subprocess.TimeoutExpired):
        return False
    return False
