"""MIG layouts: parse them, prove they fit a GPU, place them, and say what the DRA driver will publish.

A layout is a multiset of GPU-instance profiles (``1g.24gb=2,2g.48gb=1``). It is checked here, before
any host is touched, against everything the hardware enforces: per-profile instance limits, the
memory-slice and compute-slice budgets, the media engines (``+me.all`` takes all of them) and
placement feasibility, by exact search over the allowed placements. A layout that fails gets a
:class:`LayoutError` naming the profile, the slice budget and the nearest layouts that do fit.

A valid layout has one deterministic concrete placement. It follows what actually happens on a host:
mig-parted creates the largest profiles first (its ``Flatten`` order, retrying other orders on
failure) and the driver takes the lowest free placement; the search below does the same and
backtracks. The DRA driver names each device from that placement
(``gpu-<minor>-mig-<profile>-<GI profile ID>-<start>``), which :func:`expected_devices` predicts.
Where a driver places differently the names differ, so readiness should compare by profile and count
(:meth:`Layout.as_dict`) and use the names only as a hint. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from capi_gpu.gpu import catalog

_LABEL_VALUE_MAX = 63


class LayoutError(ValueError):
    """A layout that cannot be parsed or does not fit the GPU; ``suggestions`` are ones that fit."""

    def __init__(
        self,
        message: str,
        *,
        profile: str | None = None,
        budget: int | None = None,
        suggestions: tuple[Layout, ...] = (),
    ) -> None:
        super().__init__(message)
        self.profile = profile
        self.budget = budget
        self.suggestions = suggestions


@dataclass(frozen=True, slots=True)
class Layout:
    """Profile counts, normalised: lower-case names, sorted, no zero counts."""

    counts: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, counts: Mapping[str, int]) -> Layout:
        return cls(tuple(sorted((name, n) for name, n in counts.items() if n > 0)))

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)

    @property
    def instances(self) -> int:
        return sum(n for _, n in self.counts)

    def __str__(self) -> str:
        return ",".join(f"{name}={n}" for name, n in self.counts)


def _normalise_name(raw: str) -> str:
    name = raw.strip().removeprefix("MIG ").strip().lower()
    catalog.profile_variant(name)  # syntax check: raises CatalogError
    return name


def parse_layout(spec: str | Mapping[str, int] | Layout) -> Layout:
    """Parse ``'1g.24gb=2,2g.48gb=1'`` (``:`` also accepted) or a ``{profile: count}`` mapping."""
    if isinstance(spec, Layout):
        return spec
    pairs: list[tuple[str, object]]
    if isinstance(spec, Mapping):
        pairs = [(str(k), v) for k, v in spec.items()]
    else:
        pairs = []
        for item in filter(None, (part.strip() for part in spec.split(","))):
            name, sep, count = item.replace(":", "=").partition("=")
            if not sep:
                raise LayoutError(f"layout item {item!r} is not '<profile>=<count>' (e.g. '1g.24gb=2')")
            pairs.append((name, count.strip()))
    counts: dict[str, int] = {}
    for raw, given in pairs:
        value = given
        try:
            name = _normalise_name(raw)
        except catalog.CatalogError as exc:
            raise LayoutError(str(exc), profile=raw) from None
        if isinstance(value, str) and re.fullmatch(r"\d+", value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise LayoutError(f"count for {name} must be a non-negative integer, got {value!r}", profile=name)
        if name in counts:
            raise LayoutError(f"profile {name} is listed twice", profile=name)
        counts[name] = value
    return Layout.of(counts)


@dataclass(frozen=True, slots=True)
class PlacedInstance:
    """One GPU instance at a concrete placement (NVML placement units)."""

    profile: str
    gi_profile_id: int
    start: int
    size: int


def _creation_order(profiles: Iterable[catalog.MigProfile]) -> list[catalog.MigProfile]:
    # mig-parted's Flatten: larger GI first, then by attribute string (descending); then the
    # profile with fewer placements first so the first-fit choice is also the constrained one.
    return sorted(
        profiles,
        key=lambda p: (-p.compute_slices, -p.memory_slices, len(p.placement_starts), p.name),
    )


def _search(model: catalog.GpuModel, layout: Layout) -> tuple[PlacedInstance, ...] | None:
    wanted: list[catalog.MigProfile] = []
    for p in _creation_order(model.profile(name) for name, _ in layout.counts):
        wanted.extend([p] * layout.as_dict()[p.name])
    chosen: list[PlacedInstance] = []

    def go(i: int, used: int) -> bool:
        if i == len(wanted):
            return True
        p = wanted[i]
        floor = chosen[-1].start if i and wanted[i - 1] is p else -1  # identical instances: ascending
        for start in p.placement_starts:
            mask = ((1 << p.placement_size) - 1) << start
            if start <= floor or used & mask:
                continue
            chosen.append(PlacedInstance(p.name, p.gi_profile_id, start, p.placement_size))
            if go(i + 1, used | mask):
                return True
            chosen.pop()
        return False

    return tuple(chosen) if go(0, 0) else None


def problems(model: catalog.GpuModel, layout: Layout) -> list[str]:
    """Every reason the layout cannot exist on ``model``; empty when it fits."""
    unknown = [name for name, _ in layout.counts if not model.has_profile(name)]
    if unknown:
        known = ", ".join(p.name for p in model.profiles)
        return [f"{model.key} has no MIG profile {', '.join(unknown)} (known: {known})"]
    found: list[str] = []
    profiles = [(model.profile(name), n) for name, n in layout.counts]
    for p, n in profiles:
        if n > p.max_instances:
            found.append(f"{p.name}: {n} instances requested, at most {p.max_instances} fit")
    mem = sum(p.memory_slices * n for p, n in profiles)
    if mem > model.memory_slices:
        parts = ", ".join(
            f"{p.name}={n} takes {p.memory_slices * n}"
            for p, n in sorted(profiles, key=lambda pn: -pn[0].memory_slices)
        )
        found.append(f"needs {mem} memory slices, the GPU has {model.memory_slices} ({parts})")
    if found:
        return found  # compute and engine budgets follow from these; don't bury the cause
    compute = sum(p.compute_slices * n for p, n in profiles)
    if compute > model.compute_slices:
        found.append(f"needs {compute} compute slices, the GPU has {model.compute_slices}")
    engines = catalog.NO_ENGINES
    for p, n in profiles:
        for _ in range(n):
            engines = engines + p.engines
    short = engines.exceeded(model.engines)
    if short:
        takers = [p.name for p, _ in profiles if p.variant is catalog.ProfileVariant.MEDIA_ALL]
        why = f" ({', '.join(takers)} takes all media engines)" if takers else ""
        found.append(f"needs more {' and '.join(short)} than the GPU has{why}")
    if not found and _search(model, layout) is None:
        allowed = "; ".join(
            f"{p.name} at {{{','.join(map(str, p.placement_starts))}}}:{p.placement_size}" for p, _ in profiles
        )
        found.append(f"no arrangement of the allowed placements fits the {model.placement_units}-unit grid ({allowed})")
    return found


def is_valid(model: catalog.GpuModel, layout: Layout) -> bool:
    return not problems(model, layout)


def validate(model: catalog.GpuModel, spec: str | Mapping[str, int] | Layout) -> tuple[PlacedInstance, ...]:
    """Check a layout and return its deterministic placement; raise :class:`LayoutError` if it can't exist."""
    layout = parse_layout(spec)
    found = problems(model, layout)
    if found:
        suggestions = nearest_valid(model, layout)
        culprit = _culprit(model, layout)
        hint = " | ".join(str(s) for s in suggestions) if suggestions else "none"
        raise LayoutError(
            f"layout {layout or '(empty)'} does not fit {model.key} ({model.memory_slices} memory slices): "
            f"{'; '.join(found)}. Nearest valid layouts: {hint}",
            profile=culprit,
            budget=model.memory_slices,
            suggestions=suggestions,
        )
    placed = _search(model, layout)
    assert placed is not None  # problems() ran the same search
    return placed


def place(model: catalog.GpuModel, spec: str | Mapping[str, int] | Layout) -> tuple[PlacedInstance, ...]:
    """The concrete (profile, GI profile ID, start) list mig-parted and the shim create."""
    return validate(model, spec)


def _culprit(model: catalog.GpuModel, layout: Layout) -> str | None:
    for name, n in layout.counts:
        if not model.has_profile(name) or n > model.profile(name).max_instances:
            return name
    known = [model.profile(name) for name, _ in layout.counts]
    return max(known, key=lambda p: (p.memory_slices, p.name)).name if known else None


def _edits(model: catalog.GpuModel, layout: Layout) -> Iterable[Layout]:
    counts = layout.as_dict()
    for name in counts:
        if not model.has_profile(name):
            yield Layout.of({k: v for k, v in counts.items() if k != name})
            continue
        yield Layout.of({**counts, name: counts[name] - 1})
        for smaller in _shrinks(model, model.profile(name)) + _swaps(model, model.profile(name)):
            changed = {**counts, name: counts[name] - 1}
            changed[smaller.name] = changed.get(smaller.name, 0) + 1
            yield Layout.of(changed)


def _shrinks(model: catalog.GpuModel, p: catalog.MigProfile) -> list[catalog.MigProfile]:
    smaller = [q for q in model.profiles if q.memory_slices < p.memory_slices]
    same_variant = [q for q in smaller if q.variant == p.variant]
    return same_variant or [q for q in smaller if q.variant == catalog.ProfileVariant.BASE]


def _swaps(model: catalog.GpuModel, p: catalog.MigProfile) -> list[catalog.MigProfile]:
    # Same size, other media variant: what resolves an engine conflict (1g.24gb -> 1g.24gb-me).
    return [q for q in model.profiles if q.memory_slices == p.memory_slices and q is not p]


def nearest_valid(model: catalog.GpuModel, layout: Layout, limit: int = 3) -> tuple[Layout, ...]:
    """The valid layouts fewest removals/shrinks away, fullest first."""
    frontier = {layout}
    seen = set(frontier)
    for _ in range(layout.instances + len(layout.counts)):
        nxt = {e for cur in frontier for e in _edits(model, cur)} - seen
        seen |= nxt
        valid = [c for c in nxt if is_valid(model, c) and c.instances]
        if valid:
            return tuple(sorted(valid, key=lambda c: _rank(model, layout, c))[:limit])
        frontier = nxt
    return ()


_SWAP_PENALTY = {catalog.ProfileVariant.BASE: 0, catalog.ProfileVariant.NO_MEDIA: 1}


def _rank(model: catalog.GpuModel, original: Layout, candidate: Layout) -> tuple[int, int, int, str]:
    # Prefer keeping what was asked for (by memory slices), then the fuller GPU, then plain variants
    # over newly introduced +gfx/+me ones.
    wanted = original.as_dict()
    kept = sum(model.profile(name).memory_slices * min(n, wanted.get(name, 0)) for name, n in candidate.counts)
    novel = sum(
        _SWAP_PENALTY.get(model.profile(name).variant, 2) * max(0, n - wanted.get(name, 0))
        for name, n in candidate.counts
    )
    return (-kept, -_slices(model, candidate), novel, str(candidate))


def _slices(model: catalog.GpuModel, layout: Layout) -> int:
    return sum(model.profile(name).memory_slices * n for name, n in layout.counts)


@dataclass(frozen=True, slots=True)
class ExpectedDevice:
    """A MIG device the NVIDIA DRA driver should publish for a layout.

    ``memory_slices`` are the NVML placement units the device covers, i.e. the ``memorySlice<N>``
    capacities the driver announces; ``slices`` is the count in the model's logical memory slices.
    """

    name: str
    profile: str
    gi_profile_id: int
    placement_start: int
    memory_slices: tuple[int, ...]
    slices: int


def dra_device_name(minor: int, profile: str, gi_profile_id: int, placement_start: int) -> str:
    """``gpu-<minor>-mig-<profile>-<GI profile ID>-<start>``, as the NVIDIA DRA driver builds it."""
    pname = profile.replace(".", "").lower()
    pname = re.sub(r"[^a-z0-9-.]", "-", pname).strip("-").removesuffix(".")
    return f"gpu-{minor}-mig-{pname}-{gi_profile_id}-{placement_start}"


def expected_devices(
    model: catalog.GpuModel, spec: str | Mapping[str, int] | Layout, *, minor: int = 0
) -> tuple[ExpectedDevice, ...]:
    """The devices a static-MIG DRA driver publishes once this layout exists on GPU ``minor``."""
    factor = model.placement_units // model.memory_slices
    return tuple(
        ExpectedDevice(
            name=dra_device_name(minor, inst.profile, inst.gi_profile_id, inst.start),
            profile=inst.profile,
            gi_profile_id=inst.gi_profile_id,
            placement_start=inst.start,
            memory_slices=tuple(range(inst.start, inst.start + inst.size)),
            slices=inst.size // factor,
        )
        for inst in sorted(validate(model, spec), key=lambda i: i.start)
    )


def layout_key(spec: str | Mapping[str, int] | Layout) -> str:
    """A stable label value for a layout: ``2x1g.24gb_1x2g.48gb``; ``+`` becomes ``.`` as in
    mig-parted's config names (``1g.24gb.me``), ``-me`` stays; over 63 characters it is cut and
    suffixed with a hash so distinct layouts keep distinct keys.
    """
    layout = parse_layout(spec)
    if not layout.counts:
        return "none"
    key = "_".join(f"{n}x{name.replace('+', '.')}" for name, n in layout.counts)
    if len(key) <= _LABEL_VALUE_MAX:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"{key[: _LABEL_VALUE_MAX - 11].rstrip('._-')}-{digest}"
