"""Reading unstructured API objects (plain JSON dicts) without trusting their shape.

The pure decisions, the autoscaler and the CLI read pods, claims, slices and Events as the API server
returns them, not as pydantic models: any field may be absent, null or of an unexpected type (an older
apiserver, a hand-written object, a fake in a test). These helpers turn such a field into a value the
caller can read on without a check at every step. They live at the bottom layer, importing nothing of
the project, so every layer above may share one copy.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any


def as_map(value: object) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one: ``as_map(obj.get("status")).get("x")`` reads
    through a missing or malformed parent as "not set"."""
    return value if isinstance(value, Mapping) else {}


def parse_time(raw: object) -> datetime.datetime | None:
    """An RFC 3339 timestamp as the API server writes it (``...Z``), always timezone-aware; None when
    ``raw`` is absent, not a string, or not a timestamp, so a bad field reads as "not known" rather
    than failing the whole pass. A stamp without an offset is taken as UTC, the API server's zone."""
    if not isinstance(raw, str) or not raw:
        return None
    try:
        stamp = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=datetime.UTC)
