"""Casting values to their declared space, and describing spaces.

A space is flattened into leaves: Box, MultiDiscrete and MultiBinary are one
leaf of the space's dtype, Discrete one int64 leaf of shape (), Dict one leaf
per key in sorted key order and Tuple one per element, nested to any depth.
A value is cast leaf by leaf to the leaf's dtype (little-endian) but keeps its
own shape, so a value of the wrong shape digests differently from a right one.

Spaces whose values vary in size flatten into as many leaves as the value
needs (docs/FORMAT.md, section 1): Text into its UTF-8 bytes; Sequence into
its length, then its elements (or, stacked, the stacked leaves); Graph into
its nodes, whether it has edges, then its edges and links; OneOf into the
index of its sub-space, then the value. A space that holds any of these is
*variable*: it has no fixed leaves, and a vector env's batch of it is split
into each env's value before casting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from gymnasium import spaces as gs

from stepledger.errors import UnsupportedSpaceError

if TYPE_CHECKING:
    import numpy.typing as npt


#: a space's description (``describe_space``): JSON-ready, the form a ledger's meta holds
Description = dict[str, Any]
#: where a leaf sits in a value: Dict keys and Tuple indices, outermost first
Path = tuple[Any, ...]
#: the nested description ``_structure`` gives of a space
Structure = tuple[Any, ...]


def canonical_dtype(dtype: npt.DTypeLike) -> np.dtype[Any]:
    """The little-endian form of a dtype, which digests are computed over."""
    dtype = np.dtype(dtype)
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


class Leaf:
    """One array in a flattened space: where it sits, its dtype and shape."""

    __slots__ = ("path", "dtype", "shape")

    def __init__(self, path: Path, dtype: npt.DTypeLike, shape: Sequence[int]) -> None:
        self.path = path
        self.dtype = canonical_dtype(dtype)
        self.shape = tuple(int(d) for d in shape)

    def name(self) -> str:
        """The leaf's key path as a report shows it, e.g. ``['pos'][0]``."""
        return "".join("[%r]" % (p,) for p in self.path)


_INT64 = canonical_dtype(np.int64)
_UINT8 = np.dtype(np.uint8)
_BOOL = np.dtype(np.bool_)
# Gymnasium's space classes, and subclasses of them (SB3's own tests use a Dict subclass):
# a value of one is what its Gymnasium base says. Any other Space is refused.
_FIXED = (gs.Box, gs.Discrete, gs.MultiDiscrete, gs.MultiBinary)
_VARIABLE = (gs.Text, gs.Sequence, gs.Graph, gs.OneOf)
_SUPPORTED = "Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple, Text, Sequence, Graph and OneOf"


def _check_type(space: gs.Space[Any], path: Path, what: str) -> None:
    if isinstance(space, _FIXED + _VARIABLE + (gs.Dict, gs.Tuple)):
        return
    where = "".join("[%r]" % (p,) for p in path)
    raise UnsupportedSpaceError(
        "%s%s is a %s, a space of its own, not one of Gymnasium's; stepledger digests %s spaces and "
        "subclasses of them, whose values it knows how to flatten: declare the env's space as one of them"
        % (what, where, type(space).__name__, _SUPPORTED))


def _leaf_dtype(space: gs.Space[Any]) -> np.dtype[Any]:
    return _INT64 if isinstance(space, gs.Discrete) else canonical_dtype(space.dtype)  # type: ignore[arg-type]


def _structure(space: gs.Space[Any], path: Path = (), what: str = "space") -> Structure:
    """A nested description used to walk values, checking every space on the way.

    ("leaf", dtype), ("dict", keys, subs), ("tuple", None, subs), ("text",),
    ("sequence", sub, stacked) with stacked true when its values are the stacked
    leaves of a fixed feature space, ("graph", node dtype, edge dtype or None),
    ("oneof", subs).
    """
    _check_type(space, path, what)
    if isinstance(space, _FIXED):
        return ("leaf", _leaf_dtype(space))
    if isinstance(space, gs.Dict):
        keys = sorted(space.spaces)
        return ("dict", keys, [_structure(space.spaces[k], path + (k,), what) for k in keys])
    if isinstance(space, gs.Tuple):
        return ("tuple", None, [_structure(s, path + (i,), what) for i, s in enumerate(space.spaces)])
    if isinstance(space, gs.Text):
        return ("text",)
    if isinstance(space, gs.Sequence):
        sub = _structure(space.feature_space, path + ("feature_space",), what)
        return ("sequence", sub, bool(space.stack) and not _is_variable(sub))
    if isinstance(space, gs.Graph):
        for name in ("node_space", "edge_space"):
            sub = getattr(space, name)
            if sub is not None and not isinstance(sub, (gs.Box, gs.Discrete)):
                raise UnsupportedSpaceError("%s%s.%s is a %s; a Graph's node and edge spaces are Box or Discrete"
                                            % (what, "".join("[%r]" % (p,) for p in path), name, type(sub).__name__))
        edge = None if space.edge_space is None else _leaf_dtype(space.edge_space)
        return ("graph", _leaf_dtype(space.node_space), edge)
    assert isinstance(space, gs.OneOf)  # the one left of those _check_type lets through
    return ("oneof", None, [_structure(s, path + (i,), what) for i, s in enumerate(space.spaces)])


def _is_variable(structure: Structure) -> bool:
    kind = structure[0]
    if kind == "leaf":
        return False
    if kind in ("dict", "tuple"):
        return any(_is_variable(sub) for sub in structure[2])
    return True


def _fixed_leaves(space: gs.Space[Any], path: Path, out: list[Leaf]) -> None:
    if isinstance(space, _FIXED):
        out.append(Leaf(path, _leaf_dtype(space), () if isinstance(space, gs.Discrete) else space.shape))
    elif isinstance(space, gs.Dict):
        for key in sorted(space.spaces):
            _fixed_leaves(space.spaces[key], path + (key,), out)
    else:
        assert isinstance(space, gs.Tuple)  # what _check_type leaves of a fixed space
        for i, sub in enumerate(space.spaces):
            _fixed_leaves(sub, path + (i,), out)


def _cast_leaf(value: Any, dtype: np.dtype[Any], out: list[Any]) -> None:
    # np.asarray, not np.ascontiguousarray: that one turns a scalar into shape (1,).
    arr = np.asarray(value, dtype=dtype)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)  # ndim >= 1 here: 0-d arrays are contiguous
    out.append(arr)


def _index(value: Any, n: int) -> int:
    """An int in [0, n) given as a Python or NumPy integer (not a bool), else ValueError."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value < n:
        raise ValueError("not an index below %d: %r" % (n, value))
    return int(value)


def _flatten(structure: Structure, value: Any, out: list[Any]) -> None:
    kind = structure[0]
    if kind == "leaf":
        _cast_leaf(value, structure[1], out)
    elif kind == "dict":
        for key, sub in zip(structure[1], structure[2]):
            _flatten(sub, value[key], out)
    elif kind == "tuple":
        subs = structure[2]
        if len(value) != len(subs):
            raise ValueError("tuple of the wrong length")
        for item, sub in zip(value, subs):
            _flatten(sub, item, out)
    elif kind == "text":
        if not isinstance(value, str):
            raise ValueError("a Text value is a str")
        out.append(np.frombuffer(value.encode("utf-8"), dtype=_UINT8))
    elif kind == "sequence":
        sub, stacked = structure[1], structure[2]
        if stacked:
            start = len(out)
            out.append(None)  # the length, once the stacked leaves tell it
            _flatten(sub, value, out)
            lengths = {a.shape[0] if a.ndim else -1 for a in out[start + 1:]}
            if len(lengths) != 1 or -1 in lengths:
                raise ValueError("stacked leaves of different lengths")
            out[start] = np.asarray(lengths.pop(), dtype=_INT64)
        else:
            if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
                raise ValueError("a Sequence value is a tuple of elements")
            out.append(np.asarray(len(value), dtype=_INT64))
            for item in value:
                _flatten(sub, item, out)
    elif kind == "graph":
        nodes, edges, links = value.nodes, value.edges, value.edge_links
        if nodes is None:
            raise ValueError("a Graph value has nodes")
        _cast_leaf(nodes, structure[1], out)
        present = edges is not None and links is not None
        if (edges is None) != (links is None) or present and structure[2] is None:
            raise ValueError("edges and edge_links come together, and only with an edge space")
        out.append(np.asarray(present, dtype=_BOOL))
        if present:
            _cast_leaf(edges, structure[2], out)
            _cast_leaf(links, _INT64, out)
    else:  # oneof
        subs = structure[2]
        if isinstance(value, (str, bytes, dict)) or len(value) != 2:
            raise ValueError("a OneOf value is (index, value)")
        i = _index(value[0], len(subs))
        out.append(np.asarray(i, dtype=_INT64))
        _flatten(subs[i], value[1], out)


def _split(structure: Structure, batch: Any, n: int) -> list[Any]:
    """Each env's value in a vector env's batch (Gymnasium's layout: arrays for fixed
    leaves, a tuple of values for a variable space), as ``iterate`` gives them."""
    kind = structure[0]
    if kind == "dict":
        per_key = [_split(sub, batch[key], n) for key, sub in zip(structure[1], structure[2])]
        return [dict(zip(structure[1], row)) for row in zip(*per_key)] if per_key else [{} for _ in range(n)]
    if kind == "tuple":
        subs = structure[2]
        if len(batch) != len(subs):
            raise ValueError("tuple batch of the wrong length")
        per_item = [_split(sub, b, n) for sub, b in zip(subs, batch)]
        return [tuple(row) for row in zip(*per_item)] if per_item else [() for _ in range(n)]
    if len(batch) != n:
        raise ValueError("batch has %d values, expected %d" % (len(batch), n))
    return [batch[i] for i in range(n)]


class LeafLayout:
    """How values of one space are flattened, cast and described.

    ``cast(value)`` gives the leaves of one value; ``cast_batch(batch)`` the
    leaves of a vector env's batch, each with a leading env dimension. Both
    raise on a value that cannot be cast; the recorders digest that as invalid.
    A variable space (one that holds Text, Sequence, Graph or OneOf) has no
    fixed ``leaves``; its batches are cast env by env (``cast_each``).
    """

    def __init__(self, space: gs.Space[Any], what: str = "space") -> None:
        self.space = space
        self.structure = _structure(space, (), what)
        self.variable = _is_variable(self.structure)
        self.leaves: list[Leaf] = []
        if not self.variable:
            _fixed_leaves(space, (), self.leaves)
        self.dtypes = [leaf.dtype for leaf in self.leaves]
        self.description = describe_space(space)
        # The compiled core digests a lone leaf without going through cast():
        # fast_leaf is (dtype, shape) when the space is one Box-like leaf.
        single = self.structure[0] == "leaf"
        self.fast_leaf: tuple[np.dtype[Any], tuple[int, ...]] | None = \
            (self.dtypes[0], self.leaves[0].shape) if single else None
        self.discrete = isinstance(space, gs.Discrete)

    def cast(self, value: Any) -> list[np.ndarray]:
        """The leaves of one value, each cast to its leaf's dtype; raises on a value that cannot be cast."""
        out: list[np.ndarray] = []
        _flatten(self.structure, value, out)
        return out

    def cast_batch(self, batch: Any) -> list[np.ndarray]:
        """The leaves of a vector env's batch, each with a leading env dimension (a fixed space only)."""
        if self.variable:
            raise ValueError("a batch of a variable space is cast env by env")
        out: list[np.ndarray] = []
        _flatten(self.structure, batch, out)
        return out

    def cast_each(self, batch: Any, n: int) -> list[list[np.ndarray] | None]:
        """The cast leaves of each env's value in a vector env's batch; None for an env whose
        value cannot be cast. For a variable space (a loop over envs: its values are Python
        objects, one per env); for a fixed one, the rows of cast_rows."""
        if not self.variable:
            try:
                rows = self.cast_rows(batch, n)
            except Exception:
                return [None] * n
            return [[r[i] for r in rows] for i in range(n)]
        try:
            values = _split(self.structure, batch, n)
        except Exception:  # not a batch of n values: every env's is invalid
            return [None] * n
        out: list[list[np.ndarray] | None] = []
        for value in values:
            try:
                out.append(self.cast(value))
            except Exception:
                out.append(None)
        return out

    def cast_per_env(self, batch: Any, n: int) -> list[list[np.ndarray] | None]:
        """The cast leaves of each env's value in a batch that sends env i ``batch[i]`` (SB3's
        layout), copied so that an env that edits its value in place cannot change them; None
        for an env whose value cannot be taken or cast."""
        out: list[list[np.ndarray] | None] = []
        for i in range(n):
            try:
                out.append([np.array(leaf, copy=True) for leaf in self.cast(batch[i])])
            except Exception:
                out.append(None)
        return out

    def cast_rows(self, batch: Any, n: int) -> list[np.ndarray]:
        """Like cast_batch, also for a batch of one-leaf values given as a list."""
        leaves = self.cast_batch(batch)
        for arr in leaves:
            if arr.ndim == 0 or arr.shape[0] != n:
                raise ValueError("batch has %s rows, expected %d" % (arr.shape[:1], n))
        return leaves


def _bound(arr: Any) -> Any:
    arr = np.asarray(arr)
    flat = arr.reshape(-1)
    if flat.size and np.all(flat == flat[0]) and not np.isnan(flat[0]):
        return _scalar(flat[0])
    return [_scalar(x) for x in flat.tolist()]


def _scalar(x: Any) -> Any:
    x = x.item() if hasattr(x, "item") else x
    return x


def describe_space(space: gs.Space[Any]) -> Description:
    """A JSON-ready description of a space, compared between the two sides."""
    _check_type(space, (), "space")
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
    if isinstance(space, gs.Text):
        return {"type": "Text", "min_length": int(space.min_length), "max_length": int(space.max_length),
                "charset": "".join(sorted(space.character_set))}
    if isinstance(space, gs.Sequence):
        return {"type": "Sequence", "space": describe_space(space.feature_space), "stack": bool(space.stack)}
    if isinstance(space, gs.Graph):
        return {"type": "Graph", "node_space": describe_space(space.node_space),
                "edge_space": None if space.edge_space is None else describe_space(space.edge_space)}
    if isinstance(space, gs.OneOf):
        return {"type": "OneOf", "spaces": [describe_space(s) for s in space.spaces]}
    raise UnsupportedSpaceError("cannot describe a %s space" % type(space).__name__)


# What a space description holds beyond what its values are digested over: bounds and ranges.
# Values of spaces that differ only in these digest alike (Gymnasium's observation_mode="different").
_NOT_DIGESTED = {"Box": ("low", "high"), "Discrete": ("n", "start"), "MultiDiscrete": ("nvec", "start"),
                 "Text": ("min_length", "max_length", "charset")}


def digest_signature(description: Any) -> Any:
    """A space description without what digests do not depend on.

    Digests depend on the structure (space types, Dict keys, Tuple lengths)
    and on each leaf's dtype and shape; Box bounds and the ranges of Discrete
    and MultiDiscrete do not change them. Two ledgers whose spaces have the
    same signature can be compared.
    """
    if not isinstance(description, dict):
        return description
    t: Any = description.get("type")
    out: dict[str, Any] = {}

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


class GraphValue:
    """A Graph value rebuilt from its leaves, for reports."""

    def __init__(self, nodes: np.ndarray, edges: np.ndarray | None, edge_links: np.ndarray | None) -> None:
        self.nodes, self.edges, self.edge_links = nodes, edges, edge_links


def is_variable_description(description: Any) -> bool:
    """True when a described space holds Text, Sequence, Graph or OneOf (no fixed leaves)."""
    t = description.get("type") if isinstance(description, dict) else None
    if t in ("Text", "Sequence", "Graph", "OneOf"):
        return True
    if t == "Dict":
        return any(is_variable_description(d) for d in description["spaces"].values())
    if t == "Tuple":
        return any(is_variable_description(d) for d in description["spaces"])
    return False


def unflatten(description: Description, leaves: Sequence[Any]) -> Any:
    """A value rebuilt from its leaves (the inverse of flattening, for reports): arrays, and
    str, tuple, dict, GraphValue and (index, value) where the space has them. ValueError if
    the leaves do not fit the description."""
    it = iter(leaves)

    def take() -> np.ndarray:
        try:
            return np.asarray(next(it))
        except StopIteration:
            raise ValueError("too few leaves for the space") from None

    def build(d: Description) -> Any:
        t = d["type"]
        if t == "Dict":
            return {k: build(d["spaces"][k]) for k in sorted(d["spaces"])}
        if t == "Tuple":
            return tuple(build(sub) for sub in d["spaces"])
        if t == "Text":
            return take().tobytes().decode("utf-8", errors="replace")
        if t == "Sequence":
            k = int(take())
            if d["stack"] and not is_variable_description(d["space"]):
                return ("stacked", k, build(d["space"]))
            return [build(d["space"]) for _ in range(k)]
        if t == "Graph":
            nodes = take()
            if bool(take()):
                return GraphValue(nodes, take(), take())
            return GraphValue(nodes, None, None)
        if t == "OneOf":
            i = int(take())
            if not 0 <= i < len(d["spaces"]):
                raise ValueError("OneOf index out of range")
            return (i, build(d["spaces"][i]))
        return take()

    value = build(description)
    if next(it, None) is not None:
        raise ValueError("more leaves than the space has")
    return value


def leaf_names(description: Description, path: str = "") -> list[str]:
    """Leaf key paths of a described space, in digest order."""
    t = description["type"]
    out: list[str]
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
