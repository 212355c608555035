"""Casting values to their declared space, and describing spaces.

A space is flattened into leaves: Box, MultiDiscrete and MultiBinary are one
leaf of the space's dtype, Discrete one int64 leaf of shape (), Dict one leaf
per key in sorted key order and Tuple one per element, nested to any depth.
A value is cast leaf by leaf to the leaf's dtype (little-endian) but keeps its
own shape, so a value of the wrong shape digests differently from a right one.
"""

import numpy as np
from gymnasium import spaces as gs

from .errors import UnsupportedSpaceError


def canonical_dtype(dtype):
    """The little-endian form of a dtype, which digests are computed over."""
    dtype = np.dtype(dtype)
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


class Leaf:
    """One array in a flattened space: where it sits, its dtype and shape."""

    __slots__ = ("path", "dtype", "shape")

    def __init__(self, path, dtype, shape):
        self.path = path
        self.dtype = canonical_dtype(dtype)
        self.shape = tuple(int(d) for d in shape)

    def name(self):
        """The leaf's key path as a report shows it, e.g. ``['pos'][0]``."""
        return "".join("[%r]" % (p,) for p in self.path)


def _leaves(space, path, out, what):
    if isinstance(space, gs.Discrete):
        out.append(Leaf(path, np.int64, ()))
    elif isinstance(space, (gs.Box, gs.MultiDiscrete, gs.MultiBinary)):
        out.append(Leaf(path, space.dtype, space.shape))
    elif isinstance(space, gs.Dict):
        for key in sorted(space.spaces):
            _leaves(space.spaces[key], path + (key,), out, what)
    elif isinstance(space, gs.Tuple):
        for i, sub in enumerate(space.spaces):
            _leaves(sub, path + (i,), out, what)
    else:
        where = "".join("[%r]" % (p,) for p in path)
        raise UnsupportedSpaceError(
            "%s%s is a %s; stepledger digests Box, Discrete, MultiDiscrete, MultiBinary, "
            "Dict and Tuple spaces" % (what, where, type(space).__name__))


def _structure(space):
    """A nested description used to walk values: 'leaf', ('dict', keys, subs) or ('tuple', subs)."""
    if isinstance(space, gs.Dict):
        keys = sorted(space.spaces)
        return ("dict", keys, [_structure(space.spaces[k]) for k in keys])
    if isinstance(space, gs.Tuple):
        return ("tuple", None, [_structure(s) for s in space.spaces])
    return "leaf"


def _flatten(structure, value, dtypes, out):
    if structure == "leaf":
        # np.asarray, not np.ascontiguousarray: that one turns a scalar into shape (1,).
        arr = np.asarray(value, dtype=dtypes[len(out)])
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)  # ndim >= 1 here: 0-d arrays are contiguous
        out.append(arr)
        return
    kind, keys, subs = structure
    if kind == "dict":
        for key, sub in zip(keys, subs):
            _flatten(sub, value[key], dtypes, out)
    else:
        if len(value) != len(subs):
            raise ValueError("tuple of the wrong length")
        for item, sub in zip(value, subs):
            _flatten(sub, item, dtypes, out)


class LeafLayout:
    """How values of one space are flattened, cast and described.

    ``cast(value)`` gives the leaves of one value; ``cast_batch(batch)`` the
    leaves of a vector env's batch, each with a leading env dimension. Both
    raise on a value that cannot be cast; the recorders digest that as invalid.
    """

    def __init__(self, space, what="space"):
        self.space = space
        self.leaves = []
        _leaves(space, (), self.leaves, what)
        self.structure = _structure(space)
        self.dtypes = [leaf.dtype for leaf in self.leaves]
        self.description = describe_space(space)
        # The compiled core digests a lone leaf without going through cast():
        # fast_leaf is (dtype, shape) when the space is one Box-like leaf.
        single = self.structure == "leaf"
        self.fast_leaf = (self.dtypes[0], self.leaves[0].shape) if single else None
        self.discrete = isinstance(space, gs.Discrete)

    def cast(self, value):
        out = []
        _flatten(self.structure, value, self.dtypes, out)
        return out

    def cast_batch(self, batch):
        out = []
        _flatten(self.structure, batch, self.dtypes, out)
        return out

    def cast_per_env(self, batch, n):
        """The cast leaves of each env's value in a batch that sends env i ``batch[i]`` (SB3's
        layout), copied so that an env that edits its value in place cannot change them; None
        for an env whose value cannot be taken or cast."""
        out = []
        for i in range(n):
            try:
                out.append([np.array(leaf, copy=True) for leaf in self.cast(batch[i])])
            except Exception:
                out.append(None)
        return out

    def cast_rows(self, batch, n):
        """Like cast_batch, also for a batch of one-leaf values given as a list."""
        leaves = self.cast_batch(batch)
        for arr in leaves:
            if arr.ndim == 0 or arr.shape[0] != n:
                raise ValueError("batch has %s rows, expected %d" % (arr.shape[:1], n))
        return leaves


def _bound(arr):
    arr = np.asarray(arr)
    flat = arr.reshape(-1)
    if flat.size and np.all(flat == flat[0]) and not np.isnan(flat[0]):
        return _scalar(flat[0])
    return [_scalar(x) for x in flat.tolist()]


def _scalar(x):
    x = x.item() if hasattr(x, "item") else x
    return x


def describe_space(space):
    """A JSON-ready description of a space, compared between the two sides."""
    if isinstance(space, gs.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": np.dtype(space.dtype).name,
                "low": _bound(space.low), "high": _bound(space.high)}
    if isinstance(space, gs.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(getattr(space, "start", 0))}
    if isinstance(space, gs.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist(),
                "start": np.asarray(getattr(space, "start", 0)).tolist(), "dtype": np.dtype(space.dtype).name}
    if isinstance(space, gs.MultiBinary):
        return {"type": "MultiBinary", "shape": list(space.shape), "dtype": np.dtype(space.dtype).name}
    if isinstance(space, gs.Dict):
        return {"type": "Dict", "spaces": {k: describe_space(space.spaces[k]) for k in sorted(space.spaces)}}
    if isinstance(space, gs.Tuple):
        return {"type": "Tuple", "spaces": [describe_space(s) for s in space.spaces]}
    raise UnsupportedSpaceError("cannot describe a %s space" % type(space).__name__)


# What a space description holds beyond what its values are digested over: bounds and ranges.
# Values of spaces that differ only in these digest alike (Gymnasium's observation_mode="different").
_NOT_DIGESTED = {"Box": ("low", "high"), "Discrete": ("n", "start"), "MultiDiscrete": ("nvec", "start")}


def digest_signature(description):
    """A space description without what digests do not depend on.

    Digests depend on the structure (space types, Dict keys, Tuple lengths)
    and on each leaf's dtype and shape; Box bounds and the ranges of Discrete
    and MultiDiscrete do not change them. Two ledgers whose spaces have the
    same signature can be compared.
    """
    if not isinstance(description, dict):
        return description
    t = description.get("type")
    out = {}
    for key, value in description.items():
        if key in _NOT_DIGESTED.get(t, ()):
            continue
        if key == "spaces" and isinstance(value, dict):
            value = {k: digest_signature(v) for k, v in value.items()}
        elif key == "spaces" and isinstance(value, list):
            value = [digest_signature(v) for v in value]
        elif isinstance(value, dict):  # an element space (Sequence, Graph, ...)
            value = digest_signature(value)
        out[key] = value
    if t == "MultiDiscrete" and "nvec" in description:
        out["shape"] = list(np.shape(description["nvec"]))
    return out


def leaf_names(description, path=""):
    """Leaf key paths of a described space, in digest order."""
    t = description["type"]
    if t == "Dict":
        out = []
        for k in sorted(description["spaces"]):
            out += leaf_names(description["spaces"][k], "%s[%r]" % (path, k))
        return out
    if t == "Tuple":
        out = []
        for i, s in enumerate(description["spaces"]):
            out += leaf_names(s, "%s[%d]" % (path, i))
        return out
    return [path]
