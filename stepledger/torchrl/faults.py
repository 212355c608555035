"""Boundary faults on purpose in a TorchRL stack: two thin adapters over ``stepledger.faults.FaultEngine``.

- In the worker: ``FaultyEnv`` (Gymnasium's, stepledger.gymnasium.faults) outside ``LedgerEnv`` and inside
  TorchRL's ``GymWrapper``, put there by ``LedgerEnvFn(wrap=inject_in_worker(fault, ...))``; every env-side
  fault (``stepledger.faults.ENV_SIDE_FAULTS``). What it changes passes through GymWrapper, the spec's
  ``encode``, ParallelEnv's shared memory and the collector before the trainer side records it.
- Between the batched env and the collector: ``FaultyTransform(fault, ...)``, a TorchRL ``Transform`` on the
  ``SerialEnv`` or ``ParallelEnv`` (``TransformedEnv(ParallelEnv(n, fns), FaultyTransform("obs:swap"))``);
  every trainer-side fault (``stepledger.faults.TRAINER_SIDE_FAULTS``), the swaps between envs among them.
  It changes the action on its way in (the batch keeps the policy's action, the env gets the faulty one) and
  the ``("next", ...)`` entries on their way out, before ``step_mdp`` and the collector's reset decision: a
  flag fault sets ``done`` too, so the collector resets (or does not reset) the env as the faulty flags say.

TorchRL never resets an env inside a step: ``("next", "observation")`` of a step that ends the episode is its
final observation, and the collector's reset comes through the transform's ``_reset`` with its ``_reset``
mask. So the engine is told each step with that observation and each reset with its own, and nothing else is
to be translated. Without a fault there is no transform: a clean run pays nothing.
"""

import numpy as np
import torch
from torchrl.data import Bounded, OneHot
from torchrl.envs import Transform

from stepledger.faults.engine import ENV_SIDE_FAULTS, TRAINER_SIDE_FAULTS, FaultEngine, Injector, check_fault
from stepledger.gymnasium.faults import FaultyEnv
from stepledger.torchrl.envs import INDEX_KEY

__all__ = ["ENV_SIDE_FAULTS", "TRAINER_SIDE_FAULTS", "FaultyTransform", "inject_in_worker"]


class inject_in_worker:
    """A picklable ``wrap(env, index)`` for ``LedgerEnvFn``: ``FaultyEnv(env, fault, index=index, ...)``, outside
    ``LedgerEnv`` in the worker. Arguments as for ``stepledger.faults.FaultyEnv``; ``record`` is a JSON file the
    worker writes where the fault first changed a value."""

    def __init__(self, fault, dose="one", at=10, target=0, seed=0, record=None):
        self.fault = check_fault(fault, ENV_SIDE_FAULTS, "stepledger.torchrl.inject_in_worker")
        self.dose, self.at, self.target, self.seed, self.record = dose, at, target, seed, record

    def __call__(self, env, index):
        return FaultyEnv(env, self.fault, index=index, dose=self.dose, at=self.at, target=self.target,
                         seed=self.seed, record=self.record)


class FaultyTransform(Injector, Transform):
    """Injects one boundary fault between a TorchRL batched env and its collector.

    ``Collector(TransformedEnv(ParallelEnv(n, ledger_env_fns(...)), FaultyTransform("reward:swap")), ...)``
    inside a ``LedgerCollector``: what it changes reaches the trainer side's ledger and not the env side's
    (for an action fault, the other way round). Row i of the batched env is env i (``ledger_env_fns``'s
    order, checked against ``INDEX_KEY`` at each reset); a swap takes the next env's value.

    Args:
        fault: one of ``TRAINER_SIDE_FAULTS``.
        dose, at, target, seed, record: as for ``stepledger.faults.FaultyEnv``.
        action_space: the single env's Gymnasium action space, for ``action:clip`` (None: read from the
            batched env's action spec, a ``Bounded`` one's bounds).
    """

    def __init__(self, fault, dose="one", at=10, target=0, seed=0, record=None, action_space=None):
        super().__init__(in_keys=[], out_keys=[])
        self.engine = FaultEngine(fault, dose, at, target, seed, record, action_space,
                                  allowed=TRAINER_SIDE_FAULTS, owner="stepledger.torchrl.FaultyTransform")
        self._on_action = self.engine.field == "action"
        self._on_obs = self.engine.field in ("obs", "final-obs")  # the other faults need no observation
        self._obs_keys = []  # the observation's keys at the root, read from the env's spec at the first reset
        self._one_hot = self._ready = False

    def _setup(self):
        env = self.parent
        if env is None:
            raise RuntimeError("stepledger.torchrl.FaultyTransform: put it on a batched env "
                               "(TransformedEnv(ParallelEnv(...), FaultyTransform(...)))")
        self._obs_keys = [k for k in env.observation_spec.keys() if k != INDEX_KEY[0]]
        spec = env.action_spec
        self._one_hot = isinstance(spec, OneHot)
        if self.engine.action_space is None and isinstance(spec, Bounded):
            import gymnasium as gym
            single = spec.shape[len(env.batch_size):]  # one env's action: the first row of the batched bounds
            low, high = (b.reshape(-1, *single)[0].cpu().numpy() for b in (spec.low, spec.high))
            self.engine.action_space = gym.spaces.Box(low, high, dtype=low.dtype)
        self._ready = True

    def _obs(self, td):
        keys = self._obs_keys
        if len(keys) == 1:
            return td.get(keys[0]).cpu().numpy()
        return {k: td.get(k).cpu().numpy() for k in keys}

    def _reset(self, tensordict, tensordict_reset):
        if not self._ready:
            self._setup()
        n = tensordict_reset.shape[0]
        mask = tensordict.get("_reset", None) if tensordict is not None else None
        rows = range(n) if mask is None else np.flatnonzero(mask.reshape(n, -1).any(-1).cpu().numpy())
        index = tensordict_reset.get(INDEX_KEY, None)
        if index is not None:
            index = index.reshape(n, -1)[:, 0].cpu().numpy()
            if any(index[i] != i for i in rows):
                raise ValueError("stepledger.torchrl.FaultyTransform: row i of the batched env must be env i "
                                 "(ledger_env_fns's order), got envs %s" % (list(index),))
        obs = self._obs(tensordict_reset) if self._on_obs else None
        for i in rows:
            self.engine.reset(int(i), _take(obs, i))
        return tensordict_reset

    def _inv_call(self, tensordict):
        if not self._on_action:
            return tensordict
        action = tensordict.get("action")
        values = action.detach().cpu().numpy()
        if self._one_hot:  # the engine works on a Discrete space's index, as GymWrapper sends it to the env
            values = values.argmax(-1)
        n = values.shape[0]
        changed = self.engine.actions([values[i] for i in range(n)], [True] * n)
        if changed:
            sent = action.clone()
            for i, a in changed.items():
                a = torch.as_tensor(np.asarray(a))
                sent[i] = torch.nn.functional.one_hot(a.long(), sent.shape[-1]) if self._one_hot else a
            tensordict.set("action", sent)  # the input is the transform's shallow copy: the batch keeps its own
        return tensordict

    def _step(self, tensordict, next_tensordict):
        n = next_tensordict.shape[0]
        obs = self._obs(next_tensordict) if self._on_obs else None
        reward = next_tensordict.get("reward")
        term, trunc = next_tensordict.get("terminated"), next_tensordict.get("truncated")
        r, te, tr = (x.reshape(n, -1)[:, 0].cpu().numpy() for x in (reward, term, trunc))
        outcomes = [(_take(obs, i), r[i], te[i], tr[i]) for i in range(n)]
        changed = self.engine.steps(outcomes, [True] * n)
        if changed:
            new = {k: v.clone() for k, v in (("reward", reward), ("terminated", term), ("truncated", trunc))}
            new_obs = {}
            for i, (o, rw, t1, t2) in changed.items():
                if o is not outcomes[i][0]:
                    for k, v in (o.items() if isinstance(o, dict) else ((self._obs_keys[0], o),)):
                        if k not in new_obs:
                            new_obs[k] = next_tensordict.get(k).clone()
                        new_obs[k][i] = torch.as_tensor(np.asarray(v), dtype=new_obs[k].dtype)
                new["reward"][i] = float(rw)
                new["terminated"][i], new["truncated"][i] = bool(t1), bool(t2)
            new["done"] = new["terminated"] | new["truncated"]
            for k, v in {**new, **new_obs}.items():
                next_tensordict.set(k, v)
        return next_tensordict


def _take(value, i):
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: v[i] for k, v in value.items()}
    return value[i]
