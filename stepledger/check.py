"""``check_boundary``: prove that a stack's ledgers catch every boundary fault.

It runs a short random-action rollout through the user's env factory and
vector env with both ledgers and compares them (the clean run must agree),
then runs it again once per fault with ``FaultyEnv`` in the workers at dose
``one``, and checks that compare names the injected env, episode, step and
field. Like Gymnasium's ``check_env``, one call in a test suite.
"""

import functools
import os
import tempfile
import warnings

import numpy as np

from .compare import compare
from .env import LedgerEnv
from .faults import ENV_SIDE_FAULTS, FaultyEnv, check_fault, read_record, reported_fields
from .vector import LedgerVectorEnv

VECTORS = ("sync", "async", "subproc", "dummy")


def is_located(difference, injected):
    """Whether compare's difference for an env names where the fault first changed a value.

    A skipped step that is never followed by a real one (``step:fill`` at
    every step) leaves the env stream shorter: compare then reports where it
    stops, one event before the fill.
    """
    d, inj = difference, injected
    if d is None or inj is None:
        return False
    if d.what in ("fields", "kind"):
        return (d.episode, d.step) == (inj["episode"], inj["step"]) and bool(set(d.fields) & reported_fields(inj["fault"]))
    if d.what == "length" and inj["fault"] == "step:fill":
        return (d.episode, d.step + 1) == (inj["episode"], inj["step"])
    return False


class FaultResult:
    """One fault's run: where it was injected and what compare said."""

    def __init__(self, fault, injected, difference):
        self.fault, self.injected, self.difference = fault, injected, difference

    @property
    def exercised(self):
        return self.injected is not None

    @property
    def caught(self):
        return self.exercised and self.difference is not None

    @property
    def located(self):
        return self.caught and is_located(self.difference, self.injected)

    def line(self):
        if not self.exercised:
            return "%-22s not exercised (no opportunity in this rollout)" % self.fault
        where = "env %d, episode %d, step %d" % (self.injected["env"], self.injected["episode"], self.injected["step"])
        if self.located:
            return "%-22s caught and located  (injected at %s)" % (self.fault, where)
        if self.caught:
            return "%-22s caught, NOT located (injected at %s; compare said: %s)" % (self.fault, where,
                                                                                    self.difference.line())
        return "%-22s NOT caught          (injected at %s)" % (self.fault, where)


class CheckReport:
    """The outcome of check_boundary: truthy when the clean run is clean and
    every exercised fault was caught and located."""

    def __init__(self, clean, results, directory):
        self.clean, self.results, self.directory = clean, results, directory

    @property
    def ok(self):
        return bool(self.clean) and all(r.located for r in self.results if r.exercised)

    def __bool__(self):
        return self.ok

    @property
    def missed(self):
        return [r.fault for r in self.results if r.exercised and not r.located]

    def __str__(self):
        lines = ["clean run: %s" % ("no difference" if self.clean else "DIFFERS\n" + str(self.clean))]
        lines += [r.line() for r in self.results]
        n_ex = sum(r.exercised for r in self.results)
        n_ok = sum(r.located for r in self.results)
        lines.append("%d of %d exercised faults caught and located; %s" % (
            n_ok, n_ex, "the boundary is checked" if self.ok else "the boundary is NOT fully checked"))
        lines.append("ledgers in %s" % self.directory)
        return "\n".join(lines)


def _gym_vector(kind, autoreset):
    import gymnasium as gym

    def build(fns):
        kwargs = {}
        if autoreset == "same":
            kwargs["autoreset_mode"] = gym.vector.AutoresetMode.SAME_STEP
        cls = gym.vector.SyncVectorEnv if kind == "sync" else gym.vector.AsyncVectorEnv
        return cls(fns, **kwargs)
    return build


def _sb3_vector(kind):
    try:
        from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv
    except ImportError:
        raise ImportError("check_boundary: vector=%r needs stable-baselines3: pip install "
                          "\"plugrl-stepledger[sb3]\"" % kind) from None

    def build(fns):
        return DummyVecEnv(fns) if kind == "dummy" else SubprocVecEnv(fns)
    return build


def _ledgered(env_fn, directory, index, fault, record, target, at):
    env = LedgerEnv(env_fn(index), directory, index=index)
    if fault is not None:
        env = FaultyEnv(env, fault, index=index, at=at, target=target, record=record)
    return env


def _rollout(env_fn, vector, sb3, n_envs, steps, directory, fault, target, at, seed):
    record = os.path.join(directory, "fault.json")
    fns = [functools.partial(_ledgered, env_fn, directory, i, fault, record, target, at) for i in range(n_envs)]
    trainer_file = os.path.join(directory, "trainer.npz")
    venv = vector(fns)
    try:
        if sb3:
            from .sb3 import LedgerVecEnv
            venv = LedgerVecEnv(venv, trainer_file)
            space = venv.action_space
        else:
            venv = LedgerVectorEnv(venv, trainer_file)
            space = venv.single_action_space
        space.seed(seed)
        actions = [np.stack([space.sample() for _ in range(n_envs)]) for _ in range(steps)]
        if sb3:
            venv.seed(seed)
            venv.reset()
        else:
            venv.reset(seed=seed)
        for a in actions:
            venv.step(a)
    finally:
        venv.close()
    return compare(directory, trainer_file), (read_record(record) if fault else None)


def check_boundary(env_fn, vector="sync", autoreset="next", n_envs=4, steps=200, faults=ENV_SIDE_FAULTS,
                   at=5, target=None, seed=0, directory=None):
    """Check that the ledgers catch and locate every boundary fault on this stack.

    Args:
        env_fn: ``env_fn(index)`` returns the user's env (with its own
            TimeLimit and wrappers; LedgerEnv is added outside it).
        vector: "sync", "async" (Gymnasium), "subproc", "dummy" (SB3), or a
            callable that takes a list of env factories and returns a
            Gymnasium vector env.
        autoreset: "next" or "same", for Gymnasium's own vector envs.
        n_envs, steps: the rollout's size; episodes must end within it for
            the episode-end faults to be exercised.
        faults: the env-side faults to inject, one run each.
        at, target: each fault is injected at the first opportunity at or
            after step ``at`` of env ``target`` (default: the last env).
        directory: where the ledgers go (default: a new temporary directory).

    Returns a CheckReport, truthy when the boundary is fully checked.
    """
    if isinstance(vector, str):
        if vector not in VECTORS:
            raise ValueError("check_boundary: vector must be one of %s or a callable, got %r" % (VECTORS, vector))
        sb3 = vector in ("subproc", "dummy")
        build = _sb3_vector(vector) if sb3 else _gym_vector(vector, autoreset)
    elif callable(vector):
        sb3, build = False, vector
    else:
        raise TypeError("check_boundary: vector must be a name or a callable, got %r" % (vector,))
    if autoreset not in ("next", "same"):
        raise ValueError("check_boundary: autoreset must be 'next' or 'same', got %r" % (autoreset,))
    if autoreset == "same" and not sb3 and isinstance(vector, str):
        import gymnasium as gym
        if not hasattr(gym.vector, "AutoresetMode"):
            raise ValueError("check_boundary: autoreset='same' needs Gymnasium 1.1 or later (Gymnasium %s's vector "
                             "envs always reset on the next step)" % gym.__version__)
    faults = [check_fault(f, ENV_SIDE_FAULTS, "check_boundary") for f in faults]
    target = n_envs - 1 if target is None else int(target)
    directory = directory or tempfile.mkdtemp(prefix="stepledger-check-")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # step-after-done warnings from faulty flags are expected
        clean, _ = _rollout(env_fn, build, sb3, n_envs, steps, os.path.join(directory, "clean"), None,
                            target, at, seed)
        results = []
        for fault in faults:
            sub = os.path.join(directory, fault.replace(":", "_"))
            report, injected = _rollout(env_fn, build, sb3, n_envs, steps, sub, fault, target, at, seed)
            diff = report.by_env().get(injected["env"]) if injected else None
            results.append(FaultResult(fault, injected, diff))
    return CheckReport(clean, results, directory)


class _RegisteredEnv:
    """A picklable factory for a registered env id (for worker processes)."""

    def __init__(self, env_id, max_episode_steps):
        self.env_id, self.max_episode_steps = env_id, max_episode_steps

    def __call__(self, index):
        import gymnasium as gym
        return gym.make(self.env_id, max_episode_steps=self.max_episode_steps)


def registered_env(env_id, max_episode_steps=None):
    return _RegisteredEnv(env_id, max_episode_steps)
