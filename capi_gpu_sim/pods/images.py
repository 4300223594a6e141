"""The container runtime's one stand-in: which local program an image runs.

Everything else about a pod (args, env, volumes, probes, restarts, status) comes from its manifest; only
the image is mapped, through this one table, to an entry point built here: our image to the checkout's
``capi-gpu`` console script, CAPI's and cert-manager's to the pinned binaries hack/build-upstream.sh
built. Paths inside an image that a manifest names as its ``command`` (CAPI's ``/manager``) map too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from capi_gpu_sim import binaries


class UnknownImage(LookupError):
    pass


@dataclass(frozen=True)
class Entry:
    entrypoint: list[str]
    default_args: list[str] = field(default_factory=list)
    paths: Mapping[str, str] = field(default_factory=dict)  # a path in the image -> the local program
    cwd: Path = binaries.REPO
    path_env: str = ""  # the image's PATH, prepended to the machine's
    own_netns: bool = False  # listeners that bind every address: the pod gets a network namespace (podnet)
    # The directories the image's files are in: they stay visible at their paths whatever a volume covers
    # (our image is the checkout and its venv; with the checkout under /tmp, as CI clones it, the manager's
    # emptyDir on /tmp hid it). The checkout's parent: ../shared (the chart archive) sits beside it.
    keep: tuple[Path, ...] = ()


def repository(image: str) -> str:
    """``registry/name:tag`` or ``...@sha256:…`` without the tag or digest."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def ours() -> Entry:
    # The Dockerfile's ENTRYPOINT ["capi-gpu"], CMD ["run"]; the venv is the image's /usr/local.
    venv_bin = Path(sys.executable).parent
    keep = (binaries.REPO.parent, venv_bin.parent)
    return Entry([str(venv_bin / "capi-gpu")], ["run"], path_env=str(venv_bin), keep=keep)


def capi_core() -> Entry:
    manager = str(binaries.ensure_built().capi_manager)
    return Entry([manager], paths={"/manager": manager})


def cert_manager(component: str) -> Callable[[], Entry]:
    def entry() -> Entry:
        program = str(binaries.ensure_cert_manager() / component)
        return Entry([program], paths={f"/app/cmd/{component}/{component}": program}, own_netns=True)

    return entry


TABLE: dict[str, Callable[[], Entry]] = {
    "ghcr.io/capi-gpu/capi-gpu": ours,
    "registry.k8s.io/cluster-api/cluster-api-controller": capi_core,
    "quay.io/jetstack/cert-manager-controller": cert_manager("controller"),
    "quay.io/jetstack/cert-manager-cainjector": cert_manager("cainjector"),
    "quay.io/jetstack/cert-manager-webhook": cert_manager("webhook"),
}


def resolve(image: str, table: Mapping[str, Callable[[], Entry]] | None = None) -> Entry:
    """The entry for ``image``; our own image under any registry a release names (``IMG=``) counts too."""
    table = TABLE if table is None else table
    repo = repository(image)
    if repo in table:
        return table[repo]()
    if repo.rsplit("/", 1)[-1] == "capi-gpu" and "ghcr.io/capi-gpu/capi-gpu" in table:
        return table["ghcr.io/capi-gpu/capi-gpu"]()
    raise UnknownImage(f"no local entry point for image {image!r} (capi_gpu_sim/pods/images.py TABLE)")


def program(argv: list[str], entry: Entry) -> list[str]:
    """``argv`` with an in-image path at its head replaced by the local program."""
    if argv and argv[0] in entry.paths:
        return [entry.paths[argv[0]], *argv[1:]]
    return argv


def path_env(entry: Entry) -> str:
    base = os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return f"{entry.path_env}:{base}" if entry.path_env else base
