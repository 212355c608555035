"""Large pairs of ledgers, written by stepledger's own writer (format/ledgerfile.write_ledger) from columns
made here, for the tests and benchmarks of compare at scale (tests/report/test_compare_parallel.py,
benchmarks/compare_scale.py): recording millions of events through the wrappers would take minutes.

The meta is a real recording's (a Recording of a Box observation and action closed with one reset), so
both sides are of one run and record with the same settings. Stream ``s`` is made from seed ``s``:
episodes of ``episode`` steps, random 64-bit digests of observations and actions, float32 reward bits.

    python tests/big_ledgers.py DIRECTORY ENVS EVENTS [--faults ENV:EVENT:FIELD ...]
"""

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(HERE) not in sys.path:
    sys.path.insert(0, os.path.dirname(HERE))

from stepledger.format import schema as S  # noqa: E402
from stepledger.core import WITHHELD_DIGEST  # noqa: E402
from stepledger.format.ledgerfile import LedgerFile, Segment, write_ledger  # noqa: E402


def real_meta(directory):
    """The trainer-side meta of a real recording (closed), and the env side's of the same run."""
    import gymnasium as gym

    from stepledger.format.spaces import LeafLayout
    from stepledger.recording.recording import Recording
    box = gym.spaces.Box(-1, 1, (3,), np.float32)
    act = gym.spaces.Box(-2, 2, (1,), np.float32)
    path = os.path.join(directory, "meta-of.npz")
    rec = Recording(path, "trainer", [0], LeafLayout(box), LeafLayout(act), np.float32, False,
                    {"autoreset_mode": "next_step"})
    rec.buffers[0].append(S.KIND_RESET, 1, 0, 0, False, False)
    rec.close()
    with LedgerFile(path) as lf:
        meta = dict(lf.meta)
    os.remove(path)
    env_meta = dict(meta, side="env")
    env_meta.pop("autoreset_mode", None)  # LedgerEnv's meta has none
    return meta, env_meta


def columns(stream, events, episode=200):
    """The event columns of stream ``stream``: ``events`` events, a reset then ``episode`` steps, and again."""
    rng = np.random.default_rng(stream)
    k = np.arange(events)
    kind = np.where(k % (episode + 1) == 0, S.KIND_RESET, S.KIND_STEP).astype(np.uint8)
    last = (k % (episode + 1) == episode)
    rew = rng.standard_normal(events).astype(np.float32).view(np.uint32).astype(np.uint64)
    rew[kind == S.KIND_RESET] = 0
    act = rng.integers(1, 2 ** 63, events, dtype=np.uint64)
    act[kind == S.KIND_RESET] = 0
    return {"kind": kind, "h_obs": rng.integers(1, 2 ** 63, events, dtype=np.uint64), "h_act": act,
            "h_rew": rew, "terminated": np.zeros(events, np.bool_), "truncated": last}


class _Lazy(dict):
    """Each stream's columns made when the writer asks for them (one stream held at a time)."""

    def __init__(self, streams, events, faults=None, seed_of=None):
        super().__init__()
        self.streams, self.events, self.faults = set(streams), events, faults or {}
        self.seed_of = seed_of or {}
        self._last = None

    def get(self, s, default=None):
        if s not in self.streams:
            return default
        if self._last is None or self._last[0] != s:
            cols = columns(self.seed_of.get(s, s), self.events)
            for event, field in self.faults.get(s, ()):
                if field == "withheld":  # the trainer side's observation withheld by its library (TorchRL's)
                    cols["h_obs"][event] = WITHHELD_DIGEST
                    continue
                col = S.FIELD_COLUMNS[field]
                cols[col][event] = (cols[col][event] ^ 1) if cols[col].dtype != np.bool_ else ~cols[col][event]
            self._last = (s, cols)
        return self._last[1]


def write_pair(directory, envs, events, faults=None, trainer_name="trainer.npz", shift=0):
    """``envs`` env ledgers ``env-N.npz`` and one trainer ledger of them all, ``events`` events a stream, in
    ``directory``; ``faults`` maps env -> [(event, field)] changed on the trainer side (field
    "withheld": the trainer's observation recorded as withheld); with ``shift``, env N's
    ledger holds the events of the trainer's env N + shift (mod envs), as a wrong index= gives. Returns (env
    dir, trainer file)."""
    os.makedirs(directory, exist_ok=True)
    meta, env_meta = real_meta(directory)
    for e in range(envs):
        write_ledger(os.path.join(directory, "env-%d.npz" % e), env_meta, [e],
                     [Segment(_Lazy([e], events, seed_of={e: (e + shift) % envs}))])
    trainer = os.path.join(directory, trainer_name)
    write_ledger(trainer, meta, list(range(envs)), [Segment(_Lazy(range(envs), events, faults))])
    return directory, trainer


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("directory")
    p.add_argument("envs", type=int)
    p.add_argument("events", type=int)
    p.add_argument("--faults", nargs="*", default=[], metavar="ENV:EVENT:FIELD")
    args = p.parse_args()
    faults = {}
    for text in args.faults:
        e, event, field = text.split(":")
        faults.setdefault(int(e), []).append((int(event), field))
    print(write_pair(args.directory, args.envs, args.events, faults))


if __name__ == "__main__":
    main()
