"""The env side for Tianshou: ``LedgerEnvFn``, an env factory for the ``env_fns`` of its vector envs.

Tianshou's vector envs take a list of factories, ``env_fns[i]()`` builds env
i, in the worker process of ``SubprocVectorEnv`` and ``ShmemVectorEnv``
(pickled with cloudpickle) or in the main process for ``DummyVectorEnv``.
``LedgerEnvFn`` builds the user's env and wraps it in ``LedgerEnv`` with the
index it was given, outermost: everything the worker, its pipe, its shared
memory and the vector env do with the env's values afterwards is the boundary.

``ShmemVectorEnv`` (and ``SubprocVectorEnv(share_memory=True)``) also calls
each ``env_fn()`` once in the main process to read the observation space,
then closes that copy before it starts the worker. That copy is a
``LedgerEnv`` of the same index in another process; it records no event,
so it writes no file, takes no lock and does not clash with the worker's
ledger (a recording that recorded nothing claims nothing; docs/ENDINGS.md).
"""

from stepledger.gymnasium.env import LedgerEnv

__all__ = ["LedgerEnvFn", "LedgerPettingZooEnvFn", "ledger_env_fns", "ledger_pettingzoo_env_fns"]


class LedgerEnvFn:
    """A picklable factory: ``LedgerEnv(make_env(), directory, index=index)``.

    Example::

        from tianshou.env import SubprocVectorEnv
        from stepledger.tianshou import ledger_env_fns
        envs = SubprocVectorEnv(ledger_env_fns(lambda: gym.make("Pendulum-v1"), 8, "ledger"))

    Args:
        make_env: builds the user's env, with its own TimeLimit and wrappers;
            called with no argument, or with the env's index if
            ``pass_index``. Tianshou pickles factories with cloudpickle, so a
            lambda is fine for its worker processes.
        directory: where the env ledgers go (``directory/env-{index}.npz``).
        index: the env's position in the vector env (``env_fns[index]``).
        pass_index: call ``make_env(index)``.
        wrap: optional ``wrap(env, index)`` applied outside ``LedgerEnv`` (an
            injector such as ``FaultyEnv``: what it changes is on the boundary).
        ledger_kwargs: passed to ``LedgerEnv`` (``reward_dtype``,
            ``keep_values``, ``flush_interval``; the same settings on the
            trainer side).
    """

    def __init__(self, make_env, directory, index, *, pass_index=False, wrap=None, **ledger_kwargs):
        if not callable(make_env):
            raise TypeError("LedgerEnvFn: make_env must be callable (it builds the env), got %r" % (make_env,))
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError("LedgerEnvFn: index must be the env's position in the vector env (a non-negative int), "
                             "got %r" % (index,))
        self.make_env, self.directory, self.index = make_env, directory, index
        self.pass_index, self.wrap, self.ledger_kwargs = bool(pass_index), wrap, ledger_kwargs

    def __call__(self):
        env = self.make_env(self.index) if self.pass_index else self.make_env()
        env = LedgerEnv(env, self.directory, index=self.index, **self.ledger_kwargs)
        if self.wrap is not None:
            env = self.wrap(env, self.index)
        return env

    def __repr__(self):
        return "LedgerEnvFn(%r, %r, index=%d)" % (self.make_env, self.directory, self.index)


def ledger_env_fns(make_env, num_envs, directory, **kwargs):
    """``[LedgerEnvFn(make_env, directory, i, **kwargs) for i in range(num_envs)]``: the ``env_fns`` of a
    Tianshou vector env whose env i records ``directory/env-{i}.npz``."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError("ledger_env_fns: num_envs must be a positive int, got %r" % (num_envs,))
    return [LedgerEnvFn(make_env, directory, i, **kwargs) for i in range(num_envs)]


class LedgerPettingZooEnvFn(LedgerEnvFn):
    """A picklable factory for Tianshou's multi-agent path: ``PettingZooEnv`` around ``LedgerAECEnv(make_env(),
    directory, index=index)``, the turn-based env side (``stepledger.pettingzoo.LedgerAECEnv``).

    ``PettingZooEnv`` resets its env when it is built, a reset no trainer ever sees: it is made around the
    env itself, and ``LedgerAECEnv`` put in after, so that the ledger starts with the collector's first reset.
    ``wrap(env, index)`` goes outside ``LedgerAECEnv``, inside ``PettingZooEnv`` (a turn-based fault injector).
    """

    def __call__(self):
        from tianshou.env import PettingZooEnv
        from stepledger.pettingzoo.aec import LedgerAECEnv

        env = self.make_env(self.index) if self.pass_index else self.make_env()
        outer = PettingZooEnv(env)
        inner = LedgerAECEnv(env, self.directory, index=self.index, **self.ledger_kwargs)
        outer.env = inner if self.wrap is None else self.wrap(inner, self.index)
        return outer


def ledger_pettingzoo_env_fns(make_env, num_envs, directory, **kwargs):
    """``[LedgerPettingZooEnvFn(make_env, directory, i, **kwargs) for i in range(num_envs)]``: the ``env_fns``
    of a Tianshou vector env of ``PettingZooEnv`` envs, env i recording ``directory/env-{i}.npz`` (one stream
    an agent), for ``LedgerMultiAgentCollector``."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError("ledger_pettingzoo_env_fns: num_envs must be a positive int, got %r" % (num_envs,))
    return [LedgerPettingZooEnvFn(make_env, directory, i, **kwargs) for i in range(num_envs)]
