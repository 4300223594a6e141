"""The MIG profile catalog: what each supported GPU model can be cut into, keyed by PCI device id.

Layout validation, the mig-parted renderer, the host inspection and the readiness gate all need the
same facts about a GPU model: which GPU-instance profiles exist, their profile IDs (what NVML and
``nvidia-smi mig -cgi`` take), how many instances fit, and where they may be placed. Getting one of
these wrong means a layout that passes validation and then fails on the host, or a readiness gate that
waits for a device the DRA driver will never publish. So they live here once, as data, with the sources
they came from.

Two grids, deliberately kept apart:

* **memory slices** are the model's logical budget (RTX PRO 6000: 4, Hopper: 8). ``1g.24gb`` uses one,
  ``2g.48gb`` two. Packing bounds and error messages speak in these.
* **placement units** are what NVML reports in ``nvidia-smi mig -lgipp`` and ``-lgi`` (Start:Size) and
  what the NVIDIA DRA driver puts into device names (``gpu-0-mig-1g24gb-14-<start>``) and
  ``memorySlice<N>`` capacities. On Hopper the two grids coincide (8 units). On RTX PRO 6000 real hosts
  report a 12-unit grid: ``1g.24gb`` at ``{0,3,6,9}:3``, ``2g.48gb`` at ``{0,6}:6``, ``4g.96gb`` at
  ``{0}:12``.

Sources: NVIDIA MIG User Guide (supported profiles, minimum drivers); real ``nvidia-smi mig -lgip`` /
``-lgipp`` outputs from RTX PRO 6000 Server Edition and H100 80GB hosts (``tests/fixtures/nvidia``);
mig-parted's ``config-default.yaml`` device filters. Values marked *verify* in the reference (the Max-Q
and Workstation device ids, H200 SM counts) are data a YAML override can replace; see
:func:`load_override` for the document format. Pure: no I/O; the caller reads the override file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum

NVIDIA_VENDOR_ID = 0x10DE

_PROFILE_NAME = re.compile(r"^(?P<compute>\d+)g\.(?P<memory>\d+)gb(?P<variant>[+-][a-z.]+)?$")


class CatalogError(ValueError):
    """The catalog does not know a model or profile, or an override document is malformed."""


class ProfileVariant(StrEnum):
    """The media-engine / graphics suffix of a GPU-instance profile name."""

    BASE = ""
    MEDIA = "+me"
    MEDIA_ALL = "+me.all"
    NO_MEDIA = "-me"
    GRAPHICS = "+gfx"


@dataclass(frozen=True, slots=True)
class Engines:
    """Media and copy engines of a profile (or, for a model, of the whole GPU)."""

    decoders: int
    encoders: int
    jpeg: int
    ofa: int
    copy_engines: int

    def __add__(self, other: Engines) -> Engines:
        return Engines(
            self.decoders + other.decoders,
            self.encoders + other.encoders,
            self.jpeg + other.jpeg,
            self.ofa + other.ofa,
            self.copy_engines + other.copy_engines,
        )

    def exceeded(self, budget: Engines) -> list[str]:
        """Names of the engine kinds where ``self`` needs more than ``budget`` has."""
        pairs = {
            "NVDEC": (self.decoders, budget.decoders),
            "NVENC": (self.encoders, budget.encoders),
            "NVJPG": (self.jpeg, budget.jpeg),
            "OFA": (self.ofa, budget.ofa),
            "copy engines": (self.copy_engines, budget.copy_engines),
        }
        return [name for name, (need, have) in pairs.items() if need > have]


NO_ENGINES = Engines(0, 0, 0, 0, 0)


def profile_compute_slices(name: str) -> int:
    """The ``<N>g`` part of a GPU-instance profile name."""
    match = _PROFILE_NAME.match(name)
    if match is None:
        raise CatalogError(f"{name!r} is not a MIG GPU-instance profile name (expected e.g. '1g.24gb+me')")
    return int(match["compute"])


def profile_variant(name: str) -> ProfileVariant:
    match = _PROFILE_NAME.match(name)
    if match is None:
        raise CatalogError(f"{name!r} is not a MIG GPU-instance profile name (expected e.g. '1g.24gb+me')")
    try:
        return ProfileVariant(match["variant"] or "")
    except ValueError:
        raise CatalogError(f"{name!r} has an unknown suffix {match['variant']!r}") from None


# NVML compute-instance profile for a CI spanning the whole GI, by compute slices
# (NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0 ... 8_SLICE = 5, 6_SLICE = 6).
_CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of one model, as ``nvidia-smi mig -lgip``/``-lgipp`` describe it."""

    name: str
    gi_profile_id: int
    max_instances: int
    placement_starts: tuple[int, ...]  # NVML placement units, as -lgipp prints them
    placement_size: int  # NVML placement units
    memory_slices: int  # the model's logical memory slices
    multiprocessors: int | None = None
    memory_gib: float | None = None  # informational: varies with driver version and ECC
    engines: Engines = NO_ENGINES

    @property
    def compute_slices(self) -> int:
        return profile_compute_slices(self.name)

    @property
    def variant(self) -> ProfileVariant:
        return profile_variant(self.name)

    @property
    def ci_profile_id(self) -> int:
        """NVML compute-instance profile ID of the default (full) CI that ``-cgi ... -C`` creates."""
        return _CI_PROFILE_BY_SLICES.get(self.compute_slices, 0)

    @property
    def display_name(self) -> str:
        """The name as nvidia-smi prints it in tables (``MIG 1g.24gb``)."""
        return f"MIG {self.name}"


@dataclass(frozen=True, slots=True)
class DriverRequirement:
    """Minimum NVIDIA driver for MIG on a model (MIG User Guide)."""

    branch: str  # e.g. "R575"
    minimum: str  # e.g. "575.51.03"

    @property
    def floor(self) -> int:
        """The branch as a number (``R575`` -> 575): what a spec's ``driverBranch`` and the node install's
        ``nvidia_driver_min_branch`` are compared with."""
        digits = self.branch.strip().upper().removeprefix("R")
        if not digits.isdigit():
            raise CatalogError(f"driver branch {self.branch!r} is not R<number>")
        return int(digits)

    def satisfied_by(self, version: str) -> bool:
        """Whether an ``nvidia-smi`` driver version string meets the minimum."""
        return _version_tuple(version) >= _version_tuple(self.minimum)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = re.findall(r"\d+", version)
    if not parts:
        raise CatalogError(f"{version!r} is not a driver version")
    return tuple(int(p) for p in parts)


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A MIG-capable GPU model: its grids, budgets and profiles."""

    key: str  # short name used on the command line and in specs
    product_name: str
    architecture: str
    device_ids: tuple[int, ...]  # 16-bit PCI device ids confirmed for this model
    unverified_device_ids: tuple[int, ...]  # ids believed to be this model (*verify*)
    memory_slices: int
    compute_slices: int
    placement_units: int
    engines: Engines  # whole-GPU totals (the largest profile's row in -lgip)
    min_driver: DriverRequirement
    profiles: tuple[MigProfile, ...]
    balanced: tuple[tuple[str, int], ...] = ()  # mig-parted's ``all-balanced`` for this model

    def profile(self, name: str) -> MigProfile:
        """Look a profile up by name (``1g.24gb``, ``MIG 1g.24gb``) or by GI profile ID (``"14"``)."""
        wanted = name.strip().removeprefix("MIG ").strip().lower()
        for profile in self.profiles:
            if profile.name == wanted or (wanted.isdigit() and profile.gi_profile_id == int(wanted)):
                return profile
        known = ", ".join(p.name for p in self.profiles)
        raise CatalogError(f"{self.key} has no MIG profile {name!r}; known profiles: {known}")

    def has_profile(self, name: str) -> bool:
        try:
            self.profile(name)
        except CatalogError:
            return False
        return True

    def all_device_ids(self) -> tuple[int, ...]:
        return self.device_ids + self.unverified_device_ids

    def pci_ids(self, *, include_unverified: bool = False) -> tuple[str, ...]:
        """Device ids in mig-parted's ``device-filter`` form (``0x2BB510DE``)."""
        ids = self.all_device_ids() if include_unverified else self.device_ids
        return tuple(format_pci_id(d) for d in ids)

    def placement_slices(self, start: int, size: int) -> range:
        """Logical memory slices covered by a placement given in NVML units."""
        factor = self.placement_units // self.memory_slices
        return range(start // factor, (start + size) // factor)


def format_pci_id(device_id: int) -> str:
    """``0x2BB5`` -> ``0x2BB510DE`` (device id, then the NVIDIA vendor id, as nvidia-smi prints it)."""
    return f"0x{device_id:04X}{NVIDIA_VENDOR_ID:04X}"


def parse_pci_device_id(value: str | int) -> int:
    """Accept ``0x2BB510DE``, ``2BB510DE``, ``0x2bb5``, ``10de:2bb5`` or an int; return ``0x2BB5``."""
    if isinstance(value, int):
        return value >> 16 if value > 0xFFFF else value
    text = value.strip().lower()
    if ":" in text:
        vendor, _, device = text.partition(":")
        if int(vendor, 16) != NVIDIA_VENDOR_ID:
            raise CatalogError(f"{value!r} is not an NVIDIA PCI id")
        return int(device, 16)
    text = text.removeprefix("0x")
    if not re.fullmatch(r"[0-9a-f]{1,8}", text):
        raise CatalogError(f"{value!r} is not a PCI device id")
    if len(text) == 8:
        if int(text[4:], 16) != NVIDIA_VENDOR_ID:
            raise CatalogError(f"{value!r} does not carry the NVIDIA vendor id 10DE")
        return int(text[:4], 16)
    return int(text, 16)


class Catalog(Mapping[str, GpuModel]):
    """Models by short name, with lookup by PCI device id."""

    def __init__(self, models: Mapping[str, GpuModel]) -> None:
        self._models = dict(models)
        for key, model in self._models.items():
            if key != model.key:
                raise CatalogError(f"model registered as {key!r} calls itself {model.key!r}")
            check_model(model)

    def __getitem__(self, key: str) -> GpuModel:
        return self._models[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    def model(self, key: str) -> GpuModel:
        """Look a model up by short name or by PCI device id; the error names what is known."""
        if key in self._models:
            return self._models[key]
        try:
            by_id = self.for_device_id(parse_pci_device_id(key))
        except (CatalogError, ValueError):
            by_id = None
        if by_id is not None:
            return by_id
        raise CatalogError(f"unknown GPU {key!r}; known: {', '.join(self._models)}")

    def for_device_id(self, device_id: str | int) -> GpuModel | None:
        wanted = parse_pci_device_id(device_id)
        for model in self._models.values():
            if wanted in model.all_device_ids():
                return model
        return None

    def replace(self, model: GpuModel) -> Catalog:
        return Catalog({**self._models, model.key: model})


def check_model(model: GpuModel) -> None:
    """Reject internally inconsistent model data (grids that don't divide, placements off the grid)."""
    if model.memory_slices <= 0 or model.placement_units % model.memory_slices:
        raise CatalogError(
            f"{model.key}: {model.placement_units} placement units do not divide into "
            f"{model.memory_slices} memory slices"
        )
    factor = model.placement_units // model.memory_slices
    seen_ids: set[int] = set()
    for p in model.profiles:
        profile_variant(p.name)
        if p.gi_profile_id in seen_ids:
            raise CatalogError(f"{model.key}: GI profile ID {p.gi_profile_id} is used twice")
        seen_ids.add(p.gi_profile_id)
        if p.placement_size % factor or p.placement_size // factor != p.memory_slices:
            raise CatalogError(
                f"{model.key}: {p.name} spans {p.placement_size} placement units, which is not "
                f"{p.memory_slices} memory slice(s) of {factor} units"
            )
        if not p.placement_starts or any(
            s < 0 or s + p.placement_size > model.placement_units for s in p.placement_starts
        ):
            raise CatalogError(f"{model.key}: {p.name} has placements outside the grid")
        if p.max_instances < 1:
            raise CatalogError(f"{model.key}: {p.name} allows no instances")
    for name, _count in model.balanced:
        model.profile(name)


def load_override(text: str, base: Catalog | None = None) -> Catalog:
    """Apply a YAML override document to ``base`` (default: the built-in catalog).

    The document is ``{models: {<key>: {...}}}``. For a key the base already has, only the fields given
    replace the built-in ones (``profiles`` replaces the whole list); a new key needs every field.
    Field names: ``productName``, ``architecture``, ``deviceIds``, ``unverifiedDeviceIds``,
    ``memorySlices``, ``computeSlices``, ``placementUnits``, ``engines``, ``minDriver``
    (``{branch, minimum}``), ``balanced`` (``{profile: count}``) and ``profiles`` (a list of
    ``{name, id, maxInstances, placements, placementSize, memorySlices?, sms?, memoryGiB?, engines?}``).
    """
    from capi_gpu.gpu import catalog_override

    return catalog_override.apply(text, base if base is not None else builtin_catalog())


def builtin_catalog() -> Catalog:
    from capi_gpu.gpu import catalog_data

    return Catalog({m.key: m for m in catalog_data.MODELS})
