"""Real ledger pairs for the hostile-file tests and the fuzzer, and ways to rewrite them.

``record_pair`` runs CountEnv in a real SyncVectorEnv with LedgerEnv in each
env and LedgerVectorEnv around it, optionally with a fault injected between
the two sides, and returns the env directory and the trainer file.
``members``/``write_members`` read and write a ledger's members as raw bytes
(the .npy data of each member), keeping or changing how each is stored.
"""

import functools
import json
import os
import re
import zipfile

import gymnasium as gym
import numpy as np

import envs_for_tests as E
from stepledger import LedgerEnv, LedgerVectorEnv
from stepledger.faults import FaultyEnv

N_ENVS = 2


def _make(directory, index, keep_values, fault, reward_dtype):
    env = LedgerEnv(E.CountEnv(length=6), directory, index=index, keep_values=keep_values, reward_dtype=reward_dtype)
    if fault:
        env = FaultyEnv(env, fault, index=index, at=4, target=1)
    return env


def record_pair(directory, keep_values=False, fault=None, steps=25, reward_dtype=np.float32):
    """Record both sides of a short run into ``directory``; returns (env dir, trainer file)."""
    directory = str(directory)
    trainer = os.path.join(directory, "trainer.npz")
    envs = gym.vector.SyncVectorEnv([functools.partial(_make, directory, i, keep_values, fault, reward_dtype)
                                     for i in range(N_ENVS)])
    envs = LedgerVectorEnv(envs, trainer, keep_values=keep_values, reward_dtype=reward_dtype)
    envs.reset(seed=0)
    for t in range(steps):
        envs.step(np.array([t % 3] * N_ENVS))
    envs.close()
    return directory, trainer


def members(path):
    """[(name, compress_type, bytes)] of a zip file, in file order."""
    with zipfile.ZipFile(path) as zf:
        return [(info.filename, info.compress_type, zf.read(info)) for info in zf.infolist()]


def write_members(path, items, compress=None):
    """Write [(name, compress_type, bytes)] as a zip at ``path``; ``compress`` overrides every member's method."""
    tmp = path + ".rewrite"
    with zipfile.ZipFile(tmp, "w", allowZip64=True) as zf:
        for name, ctype, data in items:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = ctype if compress is None else compress
            zf.writestr(info, data)
    os.replace(tmp, path)


def npy_bytes(arr):
    import io
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(arr), allow_pickle=False)
    return buf.getvalue()


def meta_of(path):
    with np.load(path, allow_pickle=False) as z:
        return json.loads(str(z["meta"][()]))


def set_meta(path, meta):
    """Replace the meta member of ``path`` with ``meta`` (a dict, or any JSON value)."""
    items = [(n, c, npy_bytes(np.array(json.dumps(meta))) if n == "meta.npy" else d) for n, c, d in members(path)]
    write_members(path, items)


def edit_meta(path, drop=(), **changes):
    meta = meta_of(path)
    for k in drop:
        meta.pop(k, None)
    meta.update(changes)
    set_meta(path, meta)


def ledger_files(env_dir, trainer):
    return sorted(os.path.join(env_dir, n) for n in os.listdir(env_dir)
                  if re.match(r"^env-\d+\.npz$", n) and os.path.isfile(os.path.join(env_dir, n))) + [trainer]
