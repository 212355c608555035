"""A pytest plugin that runs a library's own vector-env tests with wrappers inserted.

Loaded into a separate pytest run (``-p upstream_plugin``) by test_upstream_suites.py.
Before the library's tests are collected it replaces SB3's ``DummyVecEnv`` and
``SubprocVecEnv`` wherever SB3's modules refer to them, so that every VecEnv those
tests build, directly, through ``make_vec_env`` or inside a model, is built with:

- mode ``ledger``: ``LedgerEnv`` outermost around each env (in the worker for
  SubprocVecEnv) and ``LedgerVecEnv`` directly around the VecEnv, both writing into
  a fresh directory per VecEnv;
- mode ``passthrough``: a plain ``gym.Wrapper`` and a plain ``VecEnvWrapper`` in the
  same places, which change nothing;
- mode ``bare``: nothing (the suite as it ships).

Environment: ``STEPLEDGER_UPSTREAM_MODE`` (the mode) and ``STEPLEDGER_UPSTREAM_OUT`` (a
directory); ``STEPLEDGER_UPSTREAM_FORK=0`` keeps SubprocVecEnv's default start method
(forkserver), which otherwise becomes ``fork`` where the test names none, in every mode. It writes ``outcomes.json`` (test id -> passed, failed or skipped) and
``vecenvs.jsonl`` (one line per VecEnv built: test id, ledger directory, number of envs)
there, and a ``closed`` marker in each ledger directory whose VecEnv was closed.
"""

import itertools
import json
import os

import gymnasium as gym
from upstream_outcomes import Outcomes  # tests/, on the inner pytest's path

MODE = os.environ.get("STEPLEDGER_UPSTREAM_MODE", "bare")
OUT = os.environ.get("STEPLEDGER_UPSTREAM_OUT", ".")
FORK = os.environ.get("STEPLEDGER_UPSTREAM_FORK", "1") == "1"
_CURRENT = {"test": None}
_COUNTER = itertools.count()
_OUTCOMES = Outcomes()


def _env_side(fn, directory, index):
    """An env factory whose env gets the env-side wrapper outermost."""

    def make():
        env = fn()
        if not isinstance(env, gym.Env):
            return env  # not an env: let the VecEnv say what it says about it
        if MODE == "ledger":
            from stepledger import LedgerEnv
            return LedgerEnv(env, directory, index=index)
        return gym.Wrapper(env)

    return make


def _install():
    import importlib
    import sys

    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnvWrapper

    for name in ("stable_baselines3.common.env_util", "stable_baselines3.common.base_class",
                 "stable_baselines3.common.vec_env", "stable_baselines3.common.evaluation",
                 "stable_baselines3.common.callbacks"):
        importlib.import_module(name)

    class PassThrough(VecEnvWrapper):
        """Changes nothing: SB3's own VecEnvWrapper, nothing overridden but what it must."""

        def reset(self):
            return self.venv.reset()

        def step_wait(self):
            return self.venv.step_wait()

    def wrap_class(real):
        class Meta(type(real)):
            def __instancecheck__(cls, obj):  # SB3's own isinstance checks see the real VecEnv class
                return isinstance(obj, real)

            def __subclasscheck__(cls, sub):
                return issubclass(sub, real)

        def build(cls, env_fns, *args, **kwargs):
            fns = list(env_fns)
            k = next(_COUNTER)
            directory = os.path.join(OUT, "ledgers", "vec-%05d-%d" % (k, os.getpid()))
            wrapped = [_env_side(fn, directory, i) for i, fn in enumerate(fns)]
            if real is SubprocVecEnv and not args and "start_method" not in kwargs and FORK:
                kwargs["start_method"] = "fork"  # workers start in milliseconds, not seconds (all modes alike)
            venv = real(wrapped, *args, **kwargs)
            with open(os.path.join(OUT, "vecenvs.jsonl"), "a") as f:
                f.write(json.dumps({"test": _CURRENT["test"], "dir": directory, "n": len(fns),
                                    "kind": real.__name__}) + "\n")
            if MODE == "ledger":
                from stepledger.sb3 import LedgerVecEnv
                outer = LedgerVecEnv(venv, os.path.join(directory, "trainer.npz"))
            else:
                outer = PassThrough(venv)
            close = outer.close

            def close_and_mark():
                close()
                os.makedirs(directory, exist_ok=True)
                open(os.path.join(directory, "closed"), "w").close()

            outer.close = close_and_mark
            return outer

        # A class, so that isinstance(x, DummyVecEnv) and partial(SubprocVecEnv, ...) keep working;
        # building one builds the real VecEnv and returns it inside the wrapper.
        return Meta(real.__name__, (), {"__new__": build, "__module__": real.__module__,
                                        "__doc__": real.__doc__})

    replacements = {DummyVecEnv: wrap_class(DummyVecEnv), SubprocVecEnv: wrap_class(SubprocVecEnv)}
    for modname, module in list(sys.modules.items()):
        if not modname.startswith("stable_baselines3") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, type) and value in replacements:
                setattr(module, attr, replacements[value])


def pytest_configure(config):
    if MODE != "bare":
        _install()


def pytest_runtest_setup(item):
    _CURRENT["test"] = item.nodeid


def pytest_runtest_logreport(report):
    _OUTCOMES.add(report)


def pytest_sessionfinish(session, exitstatus):
    _OUTCOMES.write(OUT)
