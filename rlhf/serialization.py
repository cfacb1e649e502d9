"""The one conversion of pipeline values to plain JSON types (manifests, gate reports, rejects files)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from numbers import Integral, Real
from typing import Any


def to_jsonable(value: Any) -> Any:
    """A copy of ``value`` made of plain JSON types.

    numpy scalars become Python numbers and numpy arrays lists; NaN / inf become ``None`` (JSON has no NaN);
    tuples and sets become lists; mapping keys become strings; dataclasses and pydantic models become dicts of
    their fields. Anything else becomes ``str(value)``. Never raises.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if hasattr(value, "model_dump") and callable(value.model_dump):  # pydantic models
        return to_jsonable(value.model_dump())
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalars and arrays, pandas scalars
        try:
            return to_jsonable(value.tolist())
        except (TypeError, ValueError):
            pass
    if hasattr(value, "item") and callable(value.item):  # other 0-d array-likes
        try:
            return to_jsonable(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)
