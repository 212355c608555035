"""JSON that any parser reads: what the command line prints with ``--json``.

Python's ``json`` writes ``Infinity`` and ``NaN``, which ``JSON.parse`` and
most other parsers reject. Box bounds are often infinite, so every report and
meta passes through ``dumps`` here: finite numbers stay numbers, non-finite
ones become the strings ``"inf"``, ``"-inf"`` and ``"nan"``, and NumPy scalars
and arrays become plain numbers and lists.
"""

import json
import math

import numpy as np


def plain(value):
    """``value`` with NumPy types made plain and non-finite floats made strings."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if math.isfinite(f):
            return f
        return "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf")
    return value


def dumps(value, **kwargs):
    """``json.dumps`` of ``plain(value)``; refuses (ValueError) anything that is not valid JSON."""
    kwargs.setdefault("indent", 2)
    kwargs.setdefault("sort_keys", True)
    return json.dumps(plain(value), allow_nan=False, **kwargs)
