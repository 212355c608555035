"""Envs and collectors for tests/torchrl/: picklable factories of Gymnasium envs, and TorchRL's collectors."""

import gymnasium as gym

from stepledger.torchrl import LedgerCollector, ledger_env_fns

COLLECTORS = ("single", "multisync", "multiasync")
BATCHED = ("serial", "parallel")


class Make:
    """``gym.make(env_id, max_episode_steps=limit)``, picklable."""

    def __init__(self, env_id="Pendulum-v1", limit=25, **kwargs):
        self.env_id, self.limit, self.kwargs = env_id, limit, kwargs

    def __call__(self, index=None):
        return gym.make(self.env_id, max_episode_steps=self.limit, **self.kwargs)


def batched(kind, fns):
    from torchrl.envs import ParallelEnv, SerialEnv
    return (SerialEnv if kind == "serial" else ParallelEnv)(len(fns), fns)


def collector(kind, env, frames, total, policy=None, **kwargs):
    """A TorchRL collector of ``kind`` over ``env`` (a batched env, or for the multi-process ones a list of
    them, one per worker)."""
    from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
    if kind == "single":
        return Collector(env, policy, frames_per_batch=frames, total_frames=total, **kwargs)
    cls = MultiSyncCollector if kind == "multisync" else MultiAsyncCollector
    return cls(env, policy, frames_per_batch=frames, total_frames=total, **kwargs)


def run(kind, vector, directory, num_envs=2, frames=40, total=200, make=None, workers=2, **kwargs):
    """Collect ``total`` frames with both ledgers; returns the trainer file."""
    make = make or Make()
    fns = ledger_env_fns(make, num_envs * (1 if kind == "single" else workers), directory)
    if kind == "single":
        env = batched(vector, fns)
    else:
        env = [_Batched(vector, fns[w * num_envs:(w + 1) * num_envs]) for w in range(workers)]
    c = LedgerCollector(collector(kind, env, frames, total, **kwargs), directory + "/trainer.npz", fns)
    for _ in c:
        pass
    c.shutdown()
    return c.ledger_path


class _Batched:
    """A picklable factory of a batched env of the given env fns (one per worker of a multi-process collector)."""

    def __init__(self, vector, fns):
        self.vector, self.fns = vector, fns

    def __call__(self):
        return batched(self.vector, self.fns)
