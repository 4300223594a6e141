"""The read-only looks a host decision needs (``states.probes_for``), turned into ``Observations``.

Robot reads go through the account budget and the cached server list; a budget deferral or an open
circuit leaves the field unobserved (``None``), which every state handles as "look again later".
SSH probes classify a host-key mismatch by which of our pins the presented key matches, so "still the
old system" is told apart from "someone swapped the key".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging

from capi_gpu.api.host import HetznerGPUHost, RescueHostKey
from capi_gpu.controllers.host_context import HostEnv
from capi_gpu.hetzner import errors as robot_errors
from capi_gpu.provisioning import ssh
from capi_gpu.provisioning.model import (
    CloudInitState,
    InstallProgress,
    Observations,
    PresentedKey,
    Probe,
    ServerFacts,
    SSHOutcome,
    SSHProbe,
)
from capi_gpu.provisioning.sshtransport import md5_fingerprint
from capi_gpu.runtime.deps import Deps

log = logging.getLogger(__name__)


def rescue_pin(host: HetznerGPUHost) -> ssh.HostKeyPin | None:
    keys = host.status.host_keys.rescue
    if not keys:
        return None
    return ssh.HostKeyPin(fingerprints=tuple((k.type, k.fingerprint.lower()) for k in keys))


def os_pin(public: str) -> ssh.HostKeyPin:
    return ssh.HostKeyPin.from_public_key(public)


def _os_md5(public: str) -> str:
    return md5_fingerprint(base64.b64decode(public.split()[1]))


def classify_presented(presented: str, host: HetznerGPUHost, os_public: str) -> PresentedKey:
    fp = presented.rsplit("MD5:", 1)[-1].strip().lower()
    if os_public and fp == _os_md5(os_public):
        return PresentedKey.OS
    if any(fp == k.fingerprint.lower() for k in host.status.host_keys.rescue):
        return PresentedKey.RESCUE
    return PresentedKey.UNKNOWN


def endpoint(deps: Deps, host: HetznerGPUHost, pin: ssh.HostKeyPin) -> ssh.Endpoint:
    address = host.status.ipv4 or ""
    return ssh.Endpoint(address, pin, connect_timeout_s=deps.settings.ssh_connect_timeout)


def open_shell(deps: Deps, host: HetznerGPUHost, env: HostEnv, pin: ssh.HostKeyPin) -> ssh.HostShell:
    return deps.shell_factory(endpoint(deps, host, pin), ssh.Credentials(private_key=env.ssh_private))


def _probe_ssh(
    deps: Deps, host: HetznerGPUHost, env: HostEnv, pin: ssh.HostKeyPin, with_install: bool, with_bootstrap: bool
) -> tuple[SSHProbe, InstallProgress | None, str, bool | None, CloudInitState | None]:
    install: InstallProgress | None = None
    log_tail, sentinel, cloud = "", None, None
    shell = open_shell(deps, host, env, pin)
    try:
        name, boot = shell.hostname(), shell.boot_id()
        if with_install:
            st = shell.installimage_state()
            install, log_tail = st.state, st.log_tail
        if with_bootstrap:
            sentinel = shell.sentinel_present()
            cloud = shell.cloud_init_status()
        return SSHProbe(SSHOutcome.OK, hostname=name, boot_id=boot), install, log_tail, sentinel, cloud
    except ssh.HostKeyMismatch as exc:
        return (
            SSHProbe(
                SSHOutcome.KEY_MISMATCH,
                presented=classify_presented(exc.presented, host, env.os_key.public),
                message=f"host key {exc.presented} is not the pinned one",
            ),
            None,
            "",
            None,
            None,
        )
    except ssh.ConnectionRefused as exc:
        return SSHProbe(SSHOutcome.REFUSED, message=str(exc)), None, "", None, None
    except (ssh.ConnectTimeout, ssh.SessionDropped, ssh.CommandTimeout) as exc:
        return SSHProbe(SSHOutcome.TIMEOUT, message=str(exc)), None, "", None, None
    except ssh.AuthenticationFailed as exc:
        return SSHProbe(SSHOutcome.AUTH_FAILED, message=str(exc)), None, "", None, None
    except ssh.SSHError as exc:
        return SSHProbe(SSHOutcome.ERROR, message=str(exc)), None, "", None, None
    finally:
        with contextlib.suppress(Exception):
            shell.close()


async def _robot_server(host: HetznerGPUHost, env: HostEnv) -> dict[str, object]:
    n = host.spec.server_number
    try:
        server = await env.robot.cached_server(n)
    except robot_errors.RobotNotFound:
        return {"server_missing": True}
    except (robot_errors.RobotRequeue, robot_errors.RobotTransientError, robot_errors.RobotAuthError) as exc:
        log.info("host %s: server lookup deferred: %s", host.metadata.get("name"), type(exc).__name__)
        return {}
    out: dict[str, object] = {
        "server": ServerFacts(
            number=n,
            name=server.server_name,
            ipv4=server.server_ip,
            datacenter=server.dc,
            product=server.product,
            ipv6=(server.server_ipv6_net.rstrip(":") + "::1") if server.server_ipv6_net else None,
            status=str(server.status.value),
            cancelled=server.cancelled,
        )
    }
    if not host.status.reset_types:
        with contextlib.suppress(robot_errors.RobotError):
            out["reset_types"] = tuple((await env.robot.get_reset(n)).types)
    return out


async def _robot_rescue(host: HetznerGPUHost, env: HostEnv) -> dict[str, object]:
    try:
        rescue = await env.robot.get_rescue(host.spec.server_number)
    except robot_errors.RobotError:
        return {}
    keys = tuple(RescueHostKey(type=k.key.type or "", fingerprint=k.key.fingerprint.lower()) for k in rescue.host_key)
    return {"rescue_active": bool(rescue.active), "rescue_keys": keys}


async def observe(
    deps: Deps, host: HetznerGPUHost, env: HostEnv, probes: frozenset[Probe], base: Observations
) -> Observations:
    fields: dict[str, object] = {}
    if Probe.ROBOT_SERVER in probes:
        fields.update(await _robot_server(host, env))
    if Probe.ROBOT_RESCUE in probes:
        fields.update(await _robot_rescue(host, env))
    pin = None
    if Probe.SSH_RESCUE in probes:
        pin = rescue_pin(host)
    elif Probe.SSH_OS in probes and env.os_key.public:
        pin = os_pin(env.os_key.public)
    if pin is not None and host.status.ipv4:
        probe, install, tail, sentinel, cloud = await asyncio.to_thread(
            _probe_ssh, deps, host, env, pin, Probe.INSTALL in probes, Probe.BOOTSTRAP in probes
        )
        fields.update(ssh=probe, install=install, install_log=tail, sentinel=sentinel, cloud_init=cloud)
    return base.__class__(**{**base.__dict__, **fields})
