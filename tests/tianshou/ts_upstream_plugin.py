"""A pytest plugin that runs Tianshou's own vector-env and collector tests with wrappers inserted.

Loaded into a separate pytest run (``-p ts_upstream_plugin``) by test_tianshou_upstream.py. Before Tianshou's
tests are collected it changes two things, in every mode but ``bare``:

- every Tianshou vector env (``BaseVectorEnv.__init__``: Dummy, Subproc, Shmem) builds each env through a
  factory that wraps it outermost: ``LedgerEnv(env, directory, index=i)`` in mode ``ledger``, a plain
  ``gym.Wrapper`` in mode ``passthrough``; one fresh directory per vector env;
- ``tianshou.data.Collector`` becomes ``LedgerCollector`` writing ``directory/trainer.npz`` next to its vector
  env's ledgers (mode ``ledger``), or a Collector whose vector env is seen through a plain forwarding object
  (mode ``passthrough``). A buffer LedgerCollector refuses (a CachedReplayBuffer, stack_num > 1) gets the
  pass-through collector in both modes, and is counted. ``AsyncCollector`` is left as it is.

Environment: ``STEPLEDGER_UPSTREAM_MODE`` and ``STEPLEDGER_UPSTREAM_OUT``. It writes ``outcomes.json`` (test id ->
passed, failed or skipped), ``venvs.jsonl`` (test, directory, envs, class) and ``collectors.jsonl`` (test,
directory, recorded or why not) there.
"""

import itertools
import json
import os

import gymnasium as gym
from upstream_outcomes import Outcomes  # tests/, on the inner pytest's path

MODE = os.environ.get("STEPLEDGER_UPSTREAM_MODE", "bare")
OUT = os.environ.get("STEPLEDGER_UPSTREAM_OUT", ".")
_CURRENT = {"test": None}
_COUNTER = itertools.count()
_OUTCOMES = Outcomes()


def _log(name, **entry):
    with open(os.path.join(OUT, name), "a") as f:
        f.write(json.dumps(dict(entry, test=_CURRENT["test"])) + "\n")


class _EnvSide:
    """env_fns[i] with the env-side wrapper outermost (picklable by cloudpickle, as Tianshou sends it)."""

    def __init__(self, fn, directory, index):
        self.fn, self.directory, self.index = fn, directory, index

    def __call__(self):
        env = self.fn()
        if not isinstance(env, gym.Env) or not _has_spaces(env):
            _log("unrecorded.jsonl", env=type(env).__name__)  # a ledger needs the env's spaces (both modes alike)
            return env
        if MODE == "ledger":
            from stepledger import LedgerEnv
            return LedgerEnv(env, self.directory, index=self.index)
        return gym.Wrapper(env)


def _has_spaces(env):
    try:
        return env.observation_space is not None and env.action_space is not None
    except AttributeError:
        return False


class _Forward:
    """The pass-through counterpart of LedgerCollector's view of its vector env."""

    def __init__(self, venv):
        self.venv = venv

    def __getattr__(self, name):
        return getattr(self.venv, name)

    def __len__(self):
        return len(self.venv)

    def step(self, action, id=None):
        return self.venv.step(action, id)

    def reset(self, env_id=None, **kwargs):
        return self.venv.reset(env_id, **kwargs)


def _install():
    import tianshou.data
    import tianshou.data.collector as collector_module
    from tianshou.env import DummyVectorEnv
    from tianshou.env.venvs import BaseVectorEnv

    from stepledger.tianshou import LedgerCollector

    real_init = BaseVectorEnv.__init__

    def init(self, env_fns, worker_fn, *args, **kwargs):
        k = next(_COUNTER)
        directory = os.path.join(OUT, "ledgers", "venv-%05d-%d" % (k, os.getpid()))
        fns = [_EnvSide(fn, directory, i) for i, fn in enumerate(env_fns)]
        self._stepledger_dir = directory
        _log("venvs.jsonl", dir=directory, n=len(fns), kind=type(self).__name__)
        real_init(self, fns, worker_fn, *args, **kwargs)

    BaseVectorEnv.__init__ = init
    Collector = collector_module.Collector

    class PassCollector(Collector):
        def __init__(self, policy, env, *args, **kwargs):
            super().__init__(policy, env, *args, **kwargs)
            self.env = _Forward(self.env)

    class PluginLedgerCollector(LedgerCollector):
        def __init__(self, policy, env, *args, **kwargs):
            if isinstance(env, gym.Env) and not hasattr(env, "__len__"):
                env = DummyVectorEnv([lambda: env])  # as BaseCollector does it, here so that its directory is known
            super().__init__(policy, env, *args, path=os.path.join(env._stepledger_dir, "trainer.npz"), **kwargs)

    class Meta(type(Collector)):
        def __instancecheck__(cls, obj):
            return isinstance(obj, Collector)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, Collector)

    def build(cls, policy, env, *args, **kwargs):
        if MODE == "ledger":
            try:
                made = PluginLedgerCollector(policy, env, *args, **kwargs)
            except ValueError as exc:
                if not str(exc).startswith("LedgerCollector:"):
                    raise
                _log("collectors.jsonl", recorded=False, why=str(exc))
            else:
                _log("collectors.jsonl", recorded=True, dir=os.path.dirname(made.ledger_path))
                return made
        made = PassCollector(policy, env, *args, **kwargs)
        if MODE == "passthrough":
            _log("collectors.jsonl", recorded=False)
        return made

    # a class, so that isinstance(x, Collector) and Collector[CollectStats] (a Generic) keep working
    replacement = Meta("Collector", (), {"__new__": build, "__module__": Collector.__module__,
                                         "__doc__": Collector.__doc__,
                                         "__class_getitem__": classmethod(lambda cls, item: cls)})
    tianshou.data.Collector = replacement


def pytest_configure(config):
    if MODE != "bare":
        _install()


def pytest_runtest_setup(item):
    _CURRENT["test"] = item.nodeid


def pytest_runtest_logreport(report):
    _OUTCOMES.add(report)


def pytest_sessionfinish(session, exitstatus):
    _OUTCOMES.write(OUT)
