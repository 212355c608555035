"""Spaces of every kind, and the odd values a buggy env or boundary may give for each, shared by the core's
parity tests (tests/core/test_core_parity.py) and the env side's step-path tests (tests/gymnasium/test_env_step_path.py)."""

import numpy as np
from gymnasium import spaces as gs

import envs_for_tests as E

SPACES = {
    "box_f32": gs.Box(-1, 1, shape=(3,), dtype=np.float32),
    "box_f64_scalar": gs.Box(-1, 1, shape=(), dtype=np.float64),
    "box_uint8_image": gs.Box(0, 255, shape=(8, 8, 3), dtype=np.uint8),
    "box_int32": gs.Box(-100, 100, shape=(2, 2), dtype=np.int32),
    "discrete": gs.Discrete(6),
    "discrete_start": gs.Discrete(4, start=-2),
    "multibinary": gs.MultiBinary(5),
    "multibinary_2d": gs.MultiBinary((2, 3)),
    "multidiscrete": gs.MultiDiscrete([3, 4, 5]),
    "dict": gs.Dict({"z": gs.Discrete(3), "a": gs.Box(-1, 1, shape=(2,), dtype=np.float32)}),
    "tuple": gs.Tuple((gs.MultiBinary(2), gs.Discrete(2), gs.Box(0, 1, shape=(1,), dtype=np.float64))),
    "nested": E.mixed_space(),
    "text": gs.Text(6),
    "sequence": gs.Sequence(gs.Box(-1, 1, shape=(2,), dtype=np.float32)),
    "sequence_stacked": gs.Sequence(gs.Tuple((gs.Discrete(3), gs.MultiBinary(2))), stack=True),
    "graph": gs.Graph(gs.Discrete(4), gs.Box(0, 1, shape=(2,), dtype=np.float64)),
    "oneof": gs.OneOf((gs.Text(3), gs.Dict({"k": gs.Discrete(2)}))),
    "dict_of_text": gs.Dict({"t": gs.Text(4), "b": gs.Box(-1, 1, shape=(1,), dtype=np.float32)}),
}
VARIABLE = ("text", "sequence", "sequence_stacked", "graph", "oneof", "dict_of_text")


def odd_values(space, rng):
    """Values a buggy env or boundary might produce for ``space``."""
    sample = space.sample()
    out = [sample]
    if isinstance(space, gs.Discrete):
        out += [int(sample), np.int32(sample), np.array(sample), np.array([sample]), float(sample) + 0.7,
                True, np.uint64(2 ** 63 + 5), 2 ** 63, "x", None]
    elif isinstance(space, (gs.Box, gs.MultiBinary, gs.MultiDiscrete)):
        arr = np.asarray(sample)
        out += [arr.astype(np.float64), arr.astype(np.float16), arr.tolist(), arr.astype(arr.dtype.newbyteorder(">")),
                np.asfortranarray(arr), arr.reshape(-1), arr[None], rng.normal(size=(7,)), "bad", {"k": 1}]
    elif isinstance(space, gs.Text):
        out += ["", "é€ü", "x" * 50, b"bytes", 5, None]
    elif isinstance(space, gs.Sequence):
        out += [(), [sample[0]] if not space.stack and len(sample) else (), "bad", None, 3]
    elif isinstance(space, gs.Graph):
        out += [gs.GraphInstance(sample.nodes, None, None), gs.GraphInstance(sample.nodes, sample.edges, None),
                gs.GraphInstance(None, None, None), "bad"]
    elif isinstance(space, gs.OneOf):
        out += [(0, "ab"), (1, {"k": 1}), (2, "ab"), (True, "a"), (np.int64(0), "a"), (0,), "ab", None]
    else:
        out += [None, [], "bad"]
    return out
