"""Boundary faults on purpose in a TorchRL stack: the injector that drives ``stepledger.faults.FaultEngine``.

In the worker: ``FaultyEnv`` (Gymnasium's, stepledger.gymnasium.faults) outside ``LedgerEnv`` and inside
TorchRL's ``GymWrapper``, put there by ``LedgerEnvFn(wrap=inject_in_worker(fault, ...))``; every env-side
fault (``stepledger.faults.ENV_SIDE_FAULTS``). What it changes passes through GymWrapper, the spec's
``encode``, ParallelEnv's shared memory and the collector before the trainer side records it.

The swaps between envs (``VECTOR_FAULTS``) need an injector between the batched env and the collector;
docs/TORCHRL.md says what is not there yet.
"""

from stepledger.faults.engine import ENV_SIDE_FAULTS, check_fault
from stepledger.gymnasium.faults import FaultyEnv

__all__ = ["ENV_SIDE_FAULTS", "inject_in_worker"]


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
