"""Rows of a vector env's batch, and copies of values: the helpers every adapter and injector shares.

A batch is an array with one row per env, a dict of batches (Gymnasium's Dict
spaces, where each key may come with its mask ``"_key"`` from Gymnasium's info
merging) or a tuple of batches (Tuple spaces).
"""

from typing import Any, Callable

import numpy as np


def row(batch: Any, i: int) -> Any:
    """Env ``i``'s row of ``batch``. A dict's mask keys (``"_key"`` next to ``"key"``) are left out; a key of the
    space may itself start with ``"_"`` (its mask is then ``"__key"``), and is kept."""
    if isinstance(batch, dict):
        return {k: row(v, i) for k, v in batch.items()
                if not (isinstance(k, str) and k.startswith("_") and k[1:] in batch)}
    if isinstance(batch, tuple):
        return tuple(row(v, i) for v in batch)
    return batch[i]


def set_row(batch: Any, i: int, value: Any) -> Any:
    """Write ``value`` as env ``i``'s row of ``batch`` (in place), and return ``batch``."""
    if isinstance(batch, dict) and isinstance(value, dict):
        for k in value:
            set_row(batch[k], i, value[k])
    elif isinstance(batch, tuple):
        for b, v in zip(batch, value):
            set_row(b, i, v)
    else:
        batch[i] = value
    return batch


def map_leaves(value: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` applied to each leaf of a value made of dicts and tuples."""
    if isinstance(value, dict):
        return type(value)((k, map_leaves(v, fn)) for k, v in value.items())
    if isinstance(value, tuple):
        return tuple(map_leaves(v, fn) for v in value)
    return fn(value)


def copy_value(value: Any) -> Any:
    """A copy of ``value`` whose arrays share no memory with it."""
    return map_leaves(value, lambda v: np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
