"""The env side for TorchRL: ``LedgerEnvFn``, an env factory for ``ParallelEnv`` and ``SerialEnv``.

TorchRL's batched envs take ``create_env_fn``, one factory per worker
(``ParallelEnv(n, [fn_0, ..., fn_{n-1}])``); ``ParallelEnv`` calls each in its
worker process (``SerialEnv`` in the main process). ``LedgerEnvFn(make_env,
directory, i)`` builds the user's Gymnasium env, wraps it in ``LedgerEnv``
with index i, outermost of the Gymnasium wrappers, and hands it to TorchRL's
``GymWrapper``: everything TorchRL does with the env's values afterwards
(the spec's ``encode``, the shared-memory buffers of ``ParallelEnv``, the
collector, a ``postproc``) is the boundary.

The TorchRL env also carries its index: ``LedgerGymWrapper`` (and ``LedgerIndex``,
a transform, for a stack of one's own) puts ``INDEX_KEY`` (the env's index, int64)
in every reset and step, so that
the trainer side (``LedgerCollector``) knows which env each row of a batch
came from whatever the collector (``Collector``, ``MultiSyncCollector``,
``MultiAsyncCollector``) did to arrange them.
"""

import torch

from torchrl.data import Composite, Unbounded
from torchrl.envs import GymWrapper, Transform

from stepledger.gymnasium.env import LedgerEnv
from stepledger.recording.placement import find_in_chain

__all__ = ["INDEX_KEY", "LedgerEnvFn", "LedgerGymMixin", "LedgerGymWrapper", "LedgerIndex", "ledger_env_fns",
           "ledger_inside"]

INDEX_KEY = ("stepledger", "env")  # where each step and reset says which env it came from


class LedgerIndex(Transform):
    """Puts the env's index under ``INDEX_KEY`` in every reset and step (an int64 of shape (1,))."""

    def __init__(self, index):
        super().__init__(in_keys=[], out_keys=[INDEX_KEY])
        self.index = int(index)

    def _value(self, td):
        return _index_tensor(self.index, td.batch_size, td.device)

    def _call(self, next_tensordict):
        next_tensordict.set(INDEX_KEY, self._value(next_tensordict))
        return next_tensordict

    def _reset(self, tensordict, tensordict_reset):
        tensordict_reset.set(INDEX_KEY, self._value(tensordict_reset))
        return tensordict_reset

    def transform_observation_spec(self, observation_spec):
        return _index_spec(observation_spec)


def _index_tensor(index, batch_size, device):
    """INDEX_KEY's value: the env's index, int64, of shape the batch shape + (1,)."""
    return torch.full((*batch_size, 1), index, dtype=torch.int64, device=device)


def _index_spec(observation_spec):
    """The observation spec with INDEX_KEY's entry: int64, of shape the env's batch shape + (1,)."""
    shape = observation_spec.shape
    observation_spec[INDEX_KEY[0]] = Composite(
        {INDEX_KEY[1]: Unbounded((*shape, 1), dtype=torch.int64, device=observation_spec.device)},
        shape=shape, device=observation_spec.device)
    return observation_spec


class LedgerGymMixin:
    """What ``LedgerGymWrapper`` adds to TorchRL's ``GymWrapper`` (or a subclass of it, such as ``GymEnv``):

    - ``INDEX_KEY`` in every reset and step, and in the observation spec (``self._stepledger_index``, set before
      the specs are made);
    - ``set_seed`` below the ledger: TorchRL's ``GymWrapper`` seeds by a reset (``reset(seed=...)``) whose
      observation no batch brings; here the env inside ``LedgerEnv`` is reset with the seed instead, so the
      env is seeded exactly as without the ledger and the ledger holds only the resets the trainer gets.
    """

    _stepledger_index: int

    def _make_specs(self, env, batch_size=None):
        skip = getattr(self, "wrapper_frame_skip", 1)
        if skip > 1:
            raise ValueError(frame_skip_refused(type(self).__name__, skip))
        super()._make_specs(env, batch_size)  # type: ignore[misc]
        _index_spec(self.observation_spec)  # type: ignore[attr-defined]

    def _index(self):
        return _index_tensor(self._stepledger_index, self.batch_size, self.device)  # type: ignore[attr-defined]

    def _step(self, tensordict):
        out = super()._step(tensordict)  # type: ignore[misc]
        out.set(INDEX_KEY, self._index())
        return out

    def _reset(self, tensordict=None, **kwargs):
        out = super()._reset(tensordict, **kwargs)  # type: ignore[misc]
        out.set(INDEX_KEY, self._index())
        return out

    def _set_seed(self, seed):
        ledger = ledger_inside(self._env)  # type: ignore[attr-defined]
        if ledger is None or seed is None:
            return super()._set_seed(seed)  # type: ignore[misc]
        ledger.env.reset(seed=seed)  # as GymWrapper's reset(seed=...), beneath the ledger
        self._seed_calls_reset = True
        return None


def frame_skip_refused(owner, skip):
    """Why a ledgered TorchRL env refuses ``frame_skip``, in one line."""
    return ("%s: frame_skip=%d repeats each action %d times outside the ledger (the env ledger would hold %d steps "
            "for each step a batch brings): repeat it inside LedgerEnv instead, with Gymnasium's "
            "RepeatAction(env, num_repeats=%d) (gymnasium.wrappers, 1.3 and later) in make_env"
            % (owner, skip, skip, skip, skip))


def ledger_inside(env):
    """The ``LedgerEnv`` in a Gymnasium env's chain of wrappers (outermost first), or None."""
    return find_in_chain(env, LedgerEnv)


class LedgerGymWrapper(LedgerGymMixin, GymWrapper):
    """TorchRL's ``GymWrapper`` that puts the env's index under ``INDEX_KEY`` in every reset and step itself,
    as ``LedgerIndex`` does, without a ``TransformedEnv`` around it: the transform's machinery cost a
    ParallelEnv of 8 Pendulum envs 1.21x its throughput on 2 cores, this 1.06x (docs/TORCHRL.md). Its
    ``set_seed`` seeds the env beneath the ledger (``LedgerGymMixin``)."""

    def __init__(self, env=None, index=0, **kwargs):
        self._stepledger_index = int(index)
        super().__init__(env, **kwargs)


class LedgerEnvFn:
    """A picklable factory: ``LedgerGymWrapper(LedgerEnv(make_env(), directory, index=index), index)``.

    Example::

        from torchrl.envs import ParallelEnv
        from stepledger.torchrl import ledger_env_fns
        env = ParallelEnv(8, ledger_env_fns(lambda: gym.make("Pendulum-v1"), 8, "ledger"))

    Args:
        make_env: builds the user's Gymnasium env, with its own TimeLimit and
            wrappers; called with no argument, or with the env's index if
            ``pass_index``. ParallelEnv sends factories to its workers with
            cloudpickle, so a lambda is fine.
        directory: where the env ledgers go (``directory/env-{index}.npz``).
        index: the env's position (its worker's, in ``create_env_fn``).
        pass_index: call ``make_env(index)``.
        wrap: optional ``wrap(env, index)`` applied outside ``LedgerEnv``,
            before GymWrapper (an injector such as ``FaultyEnv``: what it
            changes is on the boundary).
        seed: seeds the env with ``seed + index`` (a reset inside LedgerEnv) before the run. TorchRL's own
            ``env.set_seed(s)`` does the same through ``LedgerGymWrapper`` (beneath the ledger), with the seeds
            TorchRL gives each worker.
        gym_kwargs: passed to ``GymWrapper`` (``categorical_action_encoding``,
            ``device``, ...).
        ledger_kwargs: passed to ``LedgerEnv`` (``reward_dtype``,
            ``keep_values``, ``flush_interval``).
    """

    def __init__(self, make_env, directory, index, *, pass_index=False, wrap=None, gym_kwargs=None, seed=None,
                 **ledger_kwargs):
        if not callable(make_env):
            raise TypeError("LedgerEnvFn: make_env must be callable (it builds the env), got %r" % (make_env,))
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError("LedgerEnvFn: index must be the env's position (a non-negative int), got %r" % (index,))
        self.make_env, self.directory, self.index = make_env, directory, index
        self.pass_index, self.wrap, self.gym_kwargs = bool(pass_index), wrap, dict(gym_kwargs or {})
        self.seed, self.ledger_kwargs = seed, ledger_kwargs

    def gym_env(self):
        """The Gymnasium env as GymWrapper gets it: the user's env in LedgerEnv (and ``wrap``)."""
        env = self.make_env(self.index) if self.pass_index else self.make_env()
        if self.seed is not None:  # inside the ledger: the seeding reset is not a reset the trainer gets
            env.reset(seed=self.seed + self.index)
            env.action_space.seed(self.seed + self.index)
        env = LedgerEnv(env, self.directory, index=self.index, **self.ledger_kwargs)
        if self.wrap is not None:
            env = self.wrap(env, self.index)
        return env

    def __call__(self):
        return LedgerGymWrapper(self.gym_env(), self.index, **self.gym_kwargs)

    def __repr__(self):
        return "LedgerEnvFn(%r, %r, index=%d)" % (self.make_env, self.directory, self.index)


def ledger_env_fns(make_env, num_envs, directory, **kwargs):
    """``[LedgerEnvFn(make_env, directory, i, **kwargs) for i in range(num_envs)]``: the ``create_env_fn`` of a
    ``ParallelEnv(num_envs, ...)`` or ``SerialEnv`` whose env i records ``directory/env-{i}.npz``."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError("ledger_env_fns: num_envs must be a positive int, got %r" % (num_envs,))
    return [LedgerEnvFn(make_env, directory, i, **kwargs) for i in range(num_envs)]
