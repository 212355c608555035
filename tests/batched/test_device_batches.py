"""Batches that arrive as torch tensors or JAX arrays on the CPU are recorded where they are (NumPy's array
interface and DLPack give the digests the memory itself), with the digests of the same values in NumPy."""

import os

import gymnasium as gym
import numpy as np
import pytest

from stepledger import EnvLedger, read
from stepledger.format.spaces import LeafLayout

OBS = gym.spaces.Box(-1, 1, (4,), np.float32)
ACT = gym.spaces.Discrete(3)


def _record(d, to_device, steps=30, n=16):
    rng = np.random.default_rng(0)
    led = EnvLedger(d, n, OBS, ACT, autoreset_mode="next_step")
    led.reset(to_device(rng.random((n, 4), dtype=np.float32)))
    for _ in range(steps):
        led.actions(to_device(rng.integers(0, 3, n)))
        led.step(to_device(rng.random((n, 4), dtype=np.float32)), to_device(rng.random(n, dtype=np.float32)),
                 to_device(rng.random(n) < 0.05), to_device(rng.random(n) < 0.02))
    led.close()
    with read(os.path.join(d, "env-0-15.npz")) as ledger:
        return {i: {k: v.tolist() for k, v in s.columns.items()} for i, s in ledger.streams.items()}


def test_torch_tensors_are_read_in_place_and_digest_as_numpy(tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.rand(16, 4)
    (leaf,) = LeafLayout(OBS).cast_rows(t, 16)
    assert leaf.ctypes.data == t.data_ptr()  # no copy: the tensor's own memory
    assert _record(str(tmp_path / "t"), torch.from_numpy) == _record(str(tmp_path / "n"), lambda x: x)


def test_jax_arrays_are_read_in_place_and_digest_as_numpy(tmp_path):
    jax = pytest.importorskip("jax")
    x = jax.numpy.asarray(np.random.default_rng(1).random((16, 4), dtype=np.float32))
    (leaf,) = LeafLayout(OBS).cast_rows(x, 16)
    assert leaf.ctypes.data == x.unsafe_buffer_pointer()  # no copy: the device buffer, on the CPU
    assert np.from_dlpack(x).ctypes.data == x.unsafe_buffer_pointer()
    assert _record(str(tmp_path / "j"), jax.numpy.asarray) == _record(str(tmp_path / "n"), lambda x: x)
