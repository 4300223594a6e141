"""Installing from a baked node image (``spec.image``, docs/node-images.md): what the Install step does in
rescue before installimage writes anything, and the decision it takes from what it finds.

In rescue, before any disk is touched: the archive is brought to one fixed path (``staged_path``: an https
URL is downloaded with curl, ``-q`` first so no .curlrc adds options, no redirect followed, nothing sent
that the URL does not hold, and the schema admits no userinfo or query; an absolute path in rescue is
linked there),
its sha256 is computed there with ``sha256sum`` and compared with the spec's; then the manifest, a member
of the archive (``image_manifest.MANIFEST_PATH``, so the sha256 covers it too), is read and checked against
the machine (``image_manifest.check``) and the spec's ``fallback`` applied. Only then does installimage get
``IMAGE <staged path>``, or plain Ubuntu (fallback FullInstall), or nothing at all (a checksum mismatch, or
a mismatch with fallback Fail: a permanent failure whose message names every reason, an Event and the
host's condition; no reset, no retry, as the same archive would fail the same way).

No value of the spec reaches a command line: the source travels over SFTP into a file the fixed script
reads (``--url "$src"``, one argv word, never parsed by the shell), as every other value does
(ssh.py). The staged file's name is built here from fixed parts and a suffix out of a closed set, because
installimage chooses its decompressor by the name's suffix and refuses a name without an architecture.

Idempotent across a controller crash: the script records which source it staged (``source``) only once
the file is complete, and stages again when that record is missing or names another source; the sha256
is computed on every attempt, so a half-written or swapped file never passes. The download runs inside
the Install action (synchronously, bounded by ``STAGE_TIMEOUT``); a detached download polled like
installimage is the better shape for images of many GB and is left for later (docs/node-images.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

from capi_gpu.api.host import ErrorType
from capi_gpu.api.machine import HetznerGPUMachineSpec
from capi_gpu.api.specs import NodeImageSpec
from capi_gpu.gpu import catalog
from capi_gpu.provisioning import image_manifest
from capi_gpu.provisioning.model import ActionResult

STAGE_DIR = "/root/capi-gpu-image"
SOURCE_WANTED = f"{STAGE_DIR}/source.want"
STAGE_TIMEOUT = 3600.0
MANIFEST_LIMIT = 65536
"""Bytes of the manifest read back; a larger member is not a manifest a bake writes."""
# installimage's suffixes (longest first, so .tar.zst is not taken for .tar); the name carries "-amd64-"
# because installimage refuses an image whose name does not say its architecture.
_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tar.zst", ".tgz", ".tar")


def staged_path(image: NodeImageSpec) -> str:
    suffix = next(s for s in _SUFFIXES if image.url.endswith(s))  # the schema's pattern admits only these
    return f"{STAGE_DIR}/capi-gpu-node-amd64-image{suffix}"


def stage_script(dest: str) -> str:
    """Fixed text but for ``dest`` (``staged_path``'s): stage ``SOURCE_WANTED``'s source at ``dest``, print
    its sha256."""
    return f"""set -eu
d={STAGE_DIR}; f={dest}
src=$(cat {SOURCE_WANTED})
if [ ! -f "$f" ] || [ "$(cat "$d/source" 2>/dev/null)" != "$src" ]; then
  rm -f -- "$f" "$f.part" "$d/source"
  case "$src" in
    /*) ln -s -- "$src" "$f" ;;
    *) code=$(curl -q -fsS --proto =https --tlsv1.2 --retry 3 --connect-timeout 30 -w '%{{http_code}}' \\
         -o "$f.part" --url "$src")
       # -f fails only from 400 on; a redirect (not followed) would leave its body as the image
       if [ "$code" != 200 ]; then rm -f -- "$f.part"; echo "image server answered HTTP $code" >&2; exit 22; fi
       mv -- "$f.part" "$f" ;;
  esac
  printf '%s' "$src" > "$d/source"
fi
sha256sum -- "$f"
"""


def member_script(dest: str) -> str:
    """Print the manifest member of the archive at ``dest`` (GNU tar finds the compression itself); exit 4
    when it has none."""
    name = image_manifest.MANIFEST_PATH
    return f"""set -u
f={dest}; out={STAGE_DIR}/manifest.json
for m in {name} ./{name}; do
  if tar -xOf "$f" --occurrence=1 "$m" >"$out" 2>/dev/null; then head -c {MANIFEST_LIMIT} "$out"; exit 0; fi
done
exit 4
"""


@dataclass(frozen=True)
class Plan:
    """What installimage gets: the staged image, or (None) the spec's plain image; ``message`` says why."""

    image_path: str | None
    message: str


def decide(
    image: NodeImageSpec,
    staged_sha256: str,
    manifest_text: str | None,
    machine: HetznerGPUMachineSpec,
    cat: catalog.Catalog,
    machine_version: str,
) -> Plan | ActionResult:
    """The decision from what rescue found; a refusal is a permanent failed ``ActionResult``."""
    if staged_sha256 != image.sha256:
        return ActionResult.failed(
            ErrorType.IMAGE_CHECKSUM_MISMATCH,
            f"the archive at spec.image.url has sha256 {staged_sha256}, spec.image.sha256 is {image.sha256}: "
            "nothing was written to the disks; publish the archive again or correct spec.image.sha256",
            permanent=True,
        )
    found: list[image_manifest.Mismatch]
    try:
        if manifest_text is None:
            raise image_manifest.ManifestError(
                f"the archive has no {image_manifest.MANIFEST_PATH}: it is not a capi-gpu node image; bake one"
            )
        manifest = image_manifest.parse(manifest_text)
    except image_manifest.ManifestError as exc:
        found = [image_manifest.Mismatch("spec.image", exc.reason, str(exc))]
    else:
        found = image_manifest.check(manifest, machine, cat, machine_version)
    why = "; ".join(map(str, found))
    verdict = image_manifest.outcome(found, image.fallback)
    match verdict:
        case image_manifest.Outcome.INSTALL_IMAGE:
            return Plan(staged_path(image), f"installing from the node image (sha256 {image.sha256[:12]}...)")
        case image_manifest.Outcome.FULL_INSTALL:
            return Plan(None, f"the node image does not fit, fallback FullInstall installs plain Ubuntu: {why}")
        case image_manifest.Outcome.FAIL:
            return ActionResult.failed(
                ErrorType.IMAGE_MISMATCH,
                f"the node image does not fit this machine (fallback Fail, nothing was written to the disks): {why}",
                permanent=True,
            )
        case _:
            assert_never(verdict)
