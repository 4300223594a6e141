"""`capi-gpu image bake HOST --to PATH`: capture a prepared standby host as a node image
(docs/node-images.md; what is captured and why in place, ``provisioning.image_bake``).

Order, so a refusal changes nothing and a failure leaves the host as it was:
1. read the HetznerGPUHost and refuse (exit 2) anything but a prepared, unclaimed standby with its OS host
   key pinned; refuse a ``--to`` that exists or does not end in ``.tar.gz``;
2. pause the host (CAPI's paused annotation, with the resourceVersion it was checked on): the host loop
   leaves it alone and no Machine claims it mid-capture;
3. SSH in with the pinned OS host key and the host's SSH Secret; probe and refuse a host that is not what
   its standby spec says (GPU, driver branch, a module for the running kernel, kubelet version) or has joined;
4. capture on the host, copy the archive here, check its sha256 here against the host's, remove it there;
5. unpause (also after a failure, in ``finally``; a host that was paused before stays paused).

A CLI killed between 2 and 5 leaves the host paused: the first line it prints says how to unpause it.
Prints the ``image:`` block for a HetznerGPUMachineTemplate. Exit codes as ``capi_gpu.cli``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from capi_gpu import domain, kube
from capi_gpu.api.host import HetznerGPUHost
from capi_gpu.cli import EXIT_EXTERNAL, EXIT_FAILED, EXIT_OK, EXIT_USAGE, kubeargs
from capi_gpu.cli.kubeargs import CliFailure
from capi_gpu.gpu import catalog
from capi_gpu.provisioning import image_bake, ssh
from capi_gpu.runtime.deps import secret_value

HOSTS = kube.ours("hetznergpuhosts")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("image", help="node images: bake one from a prepared standby host")
    verbs = p.add_subparsers(dest="image_command", required=True)
    b = verbs.add_parser("bake", help="capture a prepared standby host's root as a node image (docs/node-images.md)")
    kubeargs.add_kube_args(b)
    b.add_argument("host", help="the HetznerGPUHost (a prepared, unclaimed standby)")
    b.add_argument("--to", required=True, metavar="PATH", help="where to write the archive (.tar.gz, must not exist)")
    b.add_argument("--url", help="the https URL it will be served from, for the printed image block")
    b.set_defaults(func=kubeargs.guarded(run_bake))


class BakeShell(Protocol):
    def bake_probe(self) -> image_bake.Facts: ...

    def bake_capture(self, manifest: str) -> tuple[str, int]: ...

    def fetch(self, remote: str, local: str) -> None: ...

    def bake_cleanup(self) -> None: ...


@dataclass(frozen=True)
class Baked:
    sha256: str
    size: int
    manifest: str
    seconds: float


def bake_over(shell: BakeShell, host: HetznerGPUHost, out: Path, cat: catalog.Catalog) -> Baked:
    """Steps 3-4 on an open shell to the host's installed OS (the e2e drives this with its own shell).
    ``image_bake.BakeRefused`` before anything is written; the host's work dir is removed either way."""
    started = time.monotonic()
    facts = shell.bake_probe()
    manifest = image_bake.manifest(host, facts, cat)
    try:
        sha, size = shell.bake_capture(manifest)
        shell.fetch(image_bake.ARCHIVE, str(out))
    finally:
        shell.bake_cleanup()
    local = _sha256(out)
    if local != sha or out.stat().st_size != size:
        out.unlink()
        raise CliFailure(f"the copy here (sha256 {local}) is not the archive on the host ({sha}); bake again")
    return Baked(sha, size, manifest, time.monotonic() - started)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _target(path: str) -> Path:
    out = Path(path)
    if not out.name.endswith(".tar.gz"):
        raise CliFailure(f"--to {path}: the archive is gzip-compressed, so its name must end in .tar.gz", EXIT_USAGE)
    if out.exists():
        raise CliFailure(f"--to {path} exists; it is never overwritten", EXIT_USAGE)
    if not out.parent.is_dir():
        raise CliFailure(f"--to {path}: no directory {out.parent}", EXIT_USAGE)
    return out


def run_bake(args: argparse.Namespace) -> int:
    out = _target(args.to)
    ns = kubeargs.namespace(args) or "default"
    k = kubeargs.connect(args)
    try:
        obj = k.get(HOSTS, args.host, ns)
        host = HetznerGPUHost.model_validate(obj)
        problems = image_bake.refusals(host)
        if problems:
            raise CliFailure(f"host {ns}/{args.host} can't be baked: {'; '.join(problems)}", EXIT_USAGE)
        secret = k.get(kube.SECRETS, host.spec.robot.ssh_key_secret, ns)
        private = secret_value(secret, "ssh-privatekey", "SSH private key")
        was_paused = domain.PAUSED_ANNOTATION in (obj["metadata"].get("annotations") or {})
        if not was_paused:
            pause = image_bake.paused_patch(True)
            pause["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]  # type: ignore[index]
            k.patch(HOSTS, args.host, pause, ns)
            print(
                f"host {ns}/{args.host} paused for the bake; if this command is killed, unpause it with: "
                f"kubectl annotate -n {ns} hetznergpuhosts {args.host} {domain.PAUSED_ANNOTATION}-",
                file=sys.stderr,
            )
        try:
            return _bake(args, host, private, out)
        finally:
            if not was_paused:
                k.patch(HOSTS, args.host, image_bake.paused_patch(False), ns)
    finally:
        k.close()


def _bake(args: argparse.Namespace, host: HetznerGPUHost, private: str, out: Path) -> int:
    assert host.status.ipv4 and host.status.host_keys.os
    pin = ssh.HostKeyPin.from_public_key(host.status.host_keys.os)
    endpoint = ssh.Endpoint(host.status.ipv4, pin, connect_timeout_s=10.0)
    try:
        with ssh.ParamikoShell(endpoint, ssh.Credentials(private_key=private)) as shell:
            baked = bake_over(shell, host, out, catalog.builtin_catalog())
    except image_bake.BakeRefused as exc:
        raise CliFailure(f"host {args.host} can't be baked: {exc}", EXIT_USAGE) from None
    except ssh.SSHError as exc:
        with_partial = Path(f"{out}.part")
        if with_partial.exists():
            os.unlink(with_partial)
        raise CliFailure(f"ssh: {exc}", EXIT_EXTERNAL if isinstance(exc, ssh.ConnectTimeout) else EXIT_FAILED) from None
    url = args.url or str(out.resolve())
    print(
        f"# baked {out} from {args.host} in {baked.seconds:.0f} s: {baked.size} bytes\n"
        f"image:\n  url: {url}\n  sha256: {baked.sha256}\n"
        f"# manifest:\n" + "".join(f"#   {line}\n" for line in baked.manifest.splitlines())
    )
    return EXIT_OK if baked.size > 0 else EXIT_FAILED
