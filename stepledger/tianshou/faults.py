"""Boundary faults on purpose in a Tianshou stack: two thin adapters over ``stepledger.faults.FaultEngine``.

- in the worker: ``FaultyEnv`` (Gymnasium's, stepledger.gymnasium.faults) outside ``LedgerEnv``, put
  there by ``LedgerEnvFn(wrap=inject_in_worker(fault, ...))``; every
  env-side fault (``stepledger.faults.ENV_SIDE_FAULTS``);
- between the vector env and the collector: ``FaultyVectorEnv(venv, fault)``,
  given to ``LedgerCollector`` in place of the vector env; the trainer-side
  faults, the swaps between envs among them (``VECTOR_FAULTS``).

Tianshou's ``step(action, id)`` never resets an env: the observation a step
returns is its final one when the step ends the episode, and the collector
resets the env with ``reset(env_id=...)`` afterwards. So the engine is told
each step with the observation it returned, and each reset with its
observation, and nothing else is to be translated.
"""

import numpy as np

from stepledger.faults.engine import ENV_SIDE_FAULTS, TRAINER_SIDE_FAULTS, FaultEngine, Injector, check_fault
from stepledger.gymnasium.faults import FaultyEnv

__all__ = ["ENV_SIDE_FAULTS", "VECTOR_FAULTS", "FaultyVectorEnv", "inject_in_worker"]

# between the vector env and the collector: every trainer-side fault (step:fill is the env's own: it needs an env
# that is not stepped)
VECTOR_FAULTS = tuple(f for f in TRAINER_SIDE_FAULTS if f != "step:fill")


class inject_in_worker:
    """A picklable ``wrap(env, index)`` for ``LedgerEnvFn``: ``FaultyEnv(env, fault, index=index, ...)``, outside
    ``LedgerEnv`` in the worker. Arguments as for ``stepledger.faults.FaultyEnv``; ``record`` is a JSON file the
    worker writes where the fault first changed a value."""

    def __init__(self, fault, dose="one", at=10, target=0, seed=0, record=None):
        self.fault = check_fault(fault, ENV_SIDE_FAULTS, "stepledger.tianshou.inject_in_worker")
        self.dose, self.at, self.target, self.seed, self.record = dose, at, target, seed, record

    def __call__(self, env, index):
        return FaultyEnv(env, self.fault, index=index, dose=self.dose, at=self.at, target=self.target,
                         seed=self.seed, record=self.record)


class FaultyVectorEnv(Injector):
    """Injects one boundary fault between a Tianshou vector env and its collector.

    ``LedgerCollector(policy, FaultyVectorEnv(envs, "reward:swap"), buffer, path=...)``: what it changes is
    received by the collector, so the trainer-side ledger records it and the env-side ledgers do not.
    Everything but ``step`` and ``reset`` is the vector env's own.

    Args:
        venv: a Tianshou ``BaseVectorEnv`` (its envs wrapped in LedgerEnv).
        fault: one of ``VECTOR_FAULTS``.
        dose, at, target, seed, record: as for ``stepledger.faults.FaultyEnv``.
    """

    def __init__(self, venv, fault, dose="one", at=10, target=0, seed=0, record=None):
        self.venv = venv
        self.engine = FaultEngine(fault, dose, at, target, seed, record, venv.action_space[0],
                                  allowed=VECTOR_FAULTS, owner="stepledger.tianshou.FaultyVectorEnv")

    def __getattr__(self, name):
        return getattr(self.venv, name)

    def __len__(self):
        return len(self.venv)

    def _ids(self, id):
        return list(range(len(self.venv))) if id is None else [int(i) for i in np.atleast_1d(id)]

    def reset(self, env_id=None, **kwargs):
        obs, info = self.venv.reset(env_id, **kwargs)
        for k, i in enumerate(self._ids(env_id)):
            self.engine.reset(i, obs[k])
        return obs, info

    def step(self, action, id=None):
        ids, engine = self._ids(id), self.engine
        n, sent = len(ids), action
        for k, i in enumerate(ids):
            a = action[k]
            new = engine.action(i, a, other=action[(k + 1) % n] if n > 1 else None)
            if new is not a:
                if sent is action:
                    sent = np.array(action, copy=True)
                sent[k] = new
        obs, rew, term, trunc, info = self.venv.step(sent, id)
        outcomes = [(obs[k], rew[k], term[k], trunc[k]) for k in range(n)]
        changed = {}
        for k, i in enumerate(ids):
            out = engine.step(i, *outcomes[k], other=outcomes[(k + 1) % n][:2] if n > 1 else None)
            if any(x is not y for x, y in zip(out, outcomes[k])):
                changed[k] = out
        if changed:
            obs, rew, term, trunc = obs.copy(), rew.copy(), term.copy(), trunc.copy()
            for k, (o, r, te, tr) in changed.items():
                obs[k], rew[k], term[k], trunc[k] = o, r, te, tr
        return obs, rew, term, trunc, info

    def close(self):
        return self.venv.close()
