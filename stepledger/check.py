"""``check_boundary``: prove that a stack's ledgers catch every boundary fault.

It runs a short random-action rollout through the user's env factory and
vector env with both ledgers and compares them (the clean run must agree),
then runs it again once per fault with ``FaultyEnv`` in the workers at dose
``one``, and checks that compare names the injected env, episode, step and
field. Like Gymnasium's ``check_env``, one call in a test suite.
"""

import functools
import math
import os
import shutil
import tempfile
import warnings

import numpy as np

from . import wording
from .compare import compare
from .env import LedgerEnv
from .faults import ENV_SIDE_FAULTS, FaultyEnv, check_fault, needs, read_record, reported_fields
from .vector import LedgerVectorEnv

VECTORS = ("sync", "async", "subproc", "dummy")
# SuperSuit's SB3 wrapper tells every end as a termination: these faults cannot show through it
SB3_FORM_BLIND = ("truncated:as-term", "terminated:as-trunc")


def is_located(difference, injected):
    """Whether compare's difference for an env names where the fault first changed a value, and
    exactly the fields it changed (``faults.reported_fields``, or the record's ``fields`` where the
    fault says which it changed: an agent's whole event).

    A skipped step that is never followed by a real one (``step:fill`` at
    every step) leaves the env stream shorter: compare then reports where it
    stops, one event before the fill.
    """
    d, inj = difference, injected
    if d is None or inj is None:
        return False
    if d.what in ("fields", "kind"):
        named, expected = set(d.fields), set(inj.get("fields") or reported_fields(inj["fault"]))
        fits = (bool(named) and named <= expected) if inj["fault"] == "step:fill" else named == expected
        return (d.episode, d.step) == (inj["episode"], inj["step"]) and fits
    if d.what == "length" and inj["fault"] == "step:fill":
        return (d.episode, d.step + 1) == (inj["episode"], inj["step"])
    return False


class FaultResult:
    """One fault's run: where it was injected and what compare said.

    ``short`` is set when the fault was not exercised because the rollout
    ended before its first opportunity (``needs`` then holds the vector steps
    a rollout needs); ``reason`` says why a fault had no opportunity.
    """

    def __init__(self, fault, injected, difference, reason=None, needs=None, agents=None):
        self.fault, self.injected, self.difference = fault, injected, difference
        self.reason, self.needs = reason, needs
        self.agents = agents  # possible_agents, where the fault was injected on one agent's stream

    @property
    def short(self):
        return not self.exercised and self.needs is not None

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
            return wording.fault_result(self.fault, "not exercised", self.reason or wording.NO_OPPORTUNITY)
        inj = self.injected
        at = (inj.get("stream", inj["env"]), inj["episode"], inj["step"]) + ((self.agents,) if self.agents else ())
        if self.located:
            return wording.fault_result(self.fault, "located", at=at)
        if self.caught:
            return wording.fault_result(self.fault, "caught", at=at, said=self.difference.line())
        return wording.fault_result(self.fault, "missed", at=at)


class CheckReport:
    """The outcome of check_boundary: truthy when the clean run is clean, at
    least one fault was exercised, every exercised fault was caught and
    located, and no fault went unexercised for lack of steps.

    ``needs`` is the number of vector steps a rollout needs for every fault
    to have its opportunity, when this one was too short (else None).
    ``directory`` is where the ledgers are, or None once they were removed.
    """

    def __init__(self, clean, results, directory, steps=None):
        self.clean, self.results, self.directory, self.steps = clean, results, directory, steps

    @property
    def needs(self):
        short = [r.needs for r in self.results if r.short]
        return max(short) if short else None

    @property
    def ok(self):
        return (bool(self.clean) and any(r.exercised for r in self.results) and self.needs is None
                and all(r.located for r in self.results if r.exercised))

    def __bool__(self):
        return self.ok

    @property
    def missed(self):
        return [r.fault for r in self.results if r.exercised and not r.located]

    def __str__(self):
        lines = [wording.clean_run(str(self.clean) if not self.clean else None)]
        lines += [r.line() for r in self.results]
        n_ex = sum(r.exercised for r in self.results)
        n_ok = sum(r.located for r in self.results)
        short = None
        if self.needs is not None:
            short = (sum(r.short for r in self.results), len(self.results), self.steps, self.needs)
        lines.append(wording.check_verdict(n_ok, n_ex, self.ok, short))
        if self.directory is not None:
            lines.append(wording.ledgers_in(self.directory))
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
            # the fault injector around LedgerEnv is between the ledgers on purpose: no placement warning
            venv = LedgerVecEnv(venv, trainer_file, check_wrappers=False)
            space = venv.action_space
        else:
            venv = LedgerVectorEnv(venv, trainer_file, check_wrappers=False)
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


def clean_steps(directory, target, stream=None):
    """The target env's steps in the clean run: (terminated, truncated) per step, in order (``stream``:
    one agent's stream of env copy ``target``'s ledger)."""
    from .read import read
    with read(os.path.join(directory, "env-%d.npz" % target)) as ledger:
        cols = ledger.streams[target if stream is None else stream].columns
    steps = cols["kind"] == 1
    return np.asarray(cols["terminated"])[steps], np.asarray(cols["truncated"])[steps]


def no_opportunity(fault, term, trunc, at, target, time_limit):
    """Why ``fault`` had no opportunity in the clean rollout, and the vector steps it would need (or None).

    ``time_limit()`` gives the env's TimeLimit (or None); it is asked only when no episode ended.
    """
    n = len(term)
    ends = np.flatnonzero(term | trunc)
    need = needs(fault)

    def vector_steps(env_steps, episode_len):
        # under NEXT_STEP each episode end before the last step takes one more vector step (the reset)
        return int(env_steps + (env_steps - 1) // episode_len) if episode_len else int(env_steps)

    mean_len = int(math.ceil(n / len(ends))) if len(ends) else None
    if need in ("any", "step") and n <= at:
        return wording.too_few_steps(target, n, at), vector_steps(at + 1, mean_len or time_limit())
    if need in ("any", "step"):
        return wording.NO_OPPORTUNITY, None
    which = {"end": ends, "termination": np.flatnonzero(term), "truncation": np.flatnonzero(trunc)}[need]
    if which.size and which[-1] >= at:
        return wording.NO_OPPORTUNITY, None
    if which.size:  # seen, but only before ``at``: one more such episode after ``at`` is enough
        return wording.end_only_before(target, need, at), vector_steps(at + int(which[0]) + 1, mean_len)
    if len(ends):  # episodes did end, never this way: the env does not end them like that
        return wording.never_ended_so(target, need), None
    limit = time_limit()
    if limit:
        return wording.no_episode_end(target, n, limit), vector_steps(limit * math.ceil((at + 1) / limit), limit)
    return wording.no_episode_end(target, n), vector_steps(max(n, at) + 1, None)


def _time_limit(env_fn, target):
    """The max_episode_steps of ``env_fn(target)``'s spec, or None."""
    try:
        env = env_fn(target)
    except Exception:
        return None
    try:
        limit = getattr(getattr(env, "spec", None), "max_episode_steps", None)
        return int(limit) if limit else None
    finally:
        env.close()


def check_boundary(env_fn, vector="sync", autoreset="next", n_envs=4, steps=200, faults=ENV_SIDE_FAULTS,
                   at=5, target=None, seed=0, directory=None, keep=False, progress=None):
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
        directory: where the ledgers go (default: a new temporary directory,
            removed again when the check passes unless ``keep``).
        keep: keep the temporary directory even when the check passes.
        progress: ``progress(done, total)`` is called after each run.

    Returns a CheckReport, truthy when the boundary is fully checked. A
    rollout too short for some fault's first opportunity is not: the report
    says how many steps it needs.
    """
    for name, value in (("n_envs", n_envs), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError("check_boundary: %s must be a positive int, got %r" % (name, value))
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
    if not 0 <= target < n_envs:
        raise ValueError("check_boundary: target must be an env index below n_envs=%d, got %r" % (n_envs, target))
    time_limit = functools.lru_cache(None)(lambda: _time_limit(env_fn, target))

    def one(sub, fault):
        return _rollout(env_fn, build, sb3, n_envs, steps, sub, fault, target, at, seed)

    def opportunity(fault, clean_dir):
        return no_opportunity(fault, *clean_steps(clean_dir, target), at, target, time_limit)

    return run_check(one, faults, opportunity, directory, keep, steps, progress)


def run_check(one, faults, opportunity, directory=None, keep=False, steps=None, progress=None, agents=None,
              prefix="stepledger-check-"):
    """The check's runs: ``one(sub, fault)`` runs a rollout into directory ``sub`` (``fault`` None: the
    clean one) and returns (compare's report, where the fault was injected or None); where a fault found
    no opportunity, ``opportunity(fault, clean_dir)`` says why and how many steps a rollout needs (or
    None). Returns the CheckReport; a temporary directory made here is removed when the check passes."""
    made = directory is None
    directory = directory or tempfile.mkdtemp(prefix=prefix)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # step-after-done warnings from faulty flags are expected
            clean_dir = os.path.join(directory, "clean")
            clean, _ = one(clean_dir, None)
            if progress is not None:
                progress(1, len(faults) + 1)
            results = []
            for k, fault in enumerate(faults):
                report, injected = one(os.path.join(directory, fault.replace(":", "_")), fault)
                diff = report.by_env().get(injected.get("stream", injected["env"])) if injected else None
                reason = needs = None
                if injected is None:
                    reason, needs = opportunity(fault, clean_dir)
                results.append(FaultResult(fault, injected, diff, reason, needs, agents))
                if progress is not None:
                    progress(k + 2, len(faults) + 1)
    except BaseException:
        if made:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    out = CheckReport(clean, results, directory, steps)
    if made and out.ok and not keep:
        shutil.rmtree(directory, ignore_errors=True)
        out.directory = None
    return out


# ---------------------------------------------------------------- PettingZoo parallel envs through SuperSuit

SUPERSUIT_FORMS = ("gymnasium", "sb3")


def supersuit_rollout(env_fn, form, copies, num_cpus, steps, directory, fault=None, target=0, agent=None, at=2,
                      seed=0, dose="one"):
    """One rollout of ``copies`` copies of ``env_fn()`` through SuperSuit's vector env of ``form``, with both
    ledgers (FaultyParallelEnv outside LedgerParallelEnv where ``fault``) and random actions; returns
    (compare's report, {stream: where the fault first struck it}), from each copy's record."""
    import supersuit as ss

    from .faults import FaultyParallelEnv
    from .pettingzoo import LedgerParallelEnv, LedgerSuperSuitVecEnv, index_supersuit_copies
    env = LedgerParallelEnv(env_fn(), directory)
    if fault is not None:
        env = FaultyParallelEnv(env, fault, agent=agent, dose=dose, at=at, target=target, seed=seed,
                                record=os.path.join(directory, "fault-{env}.json"))
    trainer_file = os.path.join(directory, "trainer.npz")
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), copies, num_cpus=num_cpus,
                                 base_class="gymnasium" if form == "gymnasium" else "stable_baselines3")
    try:
        if form == "gymnasium":
            venv = LedgerSuperSuitVecEnv(venv, trainer_file)
            venv.reset(seed=seed)
        else:
            from .sb3 import LedgerVecEnv
            index_supersuit_copies(venv)
            venv = LedgerVecEnv(venv, trainer_file)
            venv.reset()  # no seed: SuperSuit's SB3 wrapper would call the seed() its vector env lacks
        space = venv.action_space
        space.seed(seed)
        for _ in range(steps):
            venv.step(np.stack([space.sample() for _ in range(venv.num_envs)]))
    finally:
        venv.close()
    injected = {}
    for c in range(copies if fault is not None else 0):
        rec = read_record(os.path.join(directory, "fault-%d.json" % c))
        if rec is not None:
            injected[rec["stream"]] = rec
    return compare(directory, trainer_file), injected


def check_parallel(env_fn, form="gymnasium", copies=2, num_cpus=0, steps=100, faults=None, agent=None, at=2,
                   target=None, seed=0, directory=None, keep=False, progress=None):
    """``check_boundary`` for a PettingZoo parallel env through SuperSuit's vector envs.

    Each fault of ``faults`` (default: every one of ``faults.MULTIAGENT_FAULTS`` the form can show) is
    injected by ``FaultyParallelEnv`` outside ``LedgerParallelEnv``, on agent ``agent`` (default: the last
    of possible_agents) of env copy ``target`` (default: the last copy), at its first opportunity at or
    after that agent's step ``at``; the report says whether compare named the copy, agent, episode, step
    and field.

    Args:
        env_fn: ``env_fn()`` returns the raw parallel env (a picklable factory: with ``num_cpus > 1`` the
            copies live in SuperSuit's worker processes).
        form: "gymnasium" (``concat_vec_envs_v1(..., base_class="gymnasium")`` and LedgerSuperSuitVecEnv)
            or "sb3" (``base_class="stable_baselines3"`` and stepledger.sb3.LedgerVecEnv).
        copies, num_cpus: SuperSuit's ``num_vec_envs`` and ``num_cpus``.
        steps: vector steps per run. Other arguments as for ``check_boundary``.
    """
    from .faults import MULTIAGENT_FAULTS
    if form not in SUPERSUIT_FORMS:
        raise ValueError("check_parallel: form must be one of %s, got %r" % (SUPERSUIT_FORMS, form))
    for name, value, least in (("copies", copies, 1), ("steps", steps, 1), ("num_cpus", num_cpus, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError("check_parallel: %s must be an int of at least %d, got %r" % (name, least, value))
    blind = SB3_FORM_BLIND if form == "sb3" else ()
    if faults is None:
        faults = [f for f in MULTIAGENT_FAULTS if f not in blind]
    faults = [check_fault(f, MULTIAGENT_FAULTS, "check_parallel") for f in faults]
    probe = env_fn()
    try:
        agents = list(probe.possible_agents)
        limit = getattr(probe.unwrapped, "max_cycles", None)
    finally:
        probe.close()
    agent = agents[-1] if agent is None else agent
    if agent not in agents:
        raise ValueError("check_parallel: agent %r is not one of possible_agents %r" % (agent, agents))
    target = copies - 1 if target is None else int(target)
    if not 0 <= target < copies:
        raise ValueError("check_parallel: target must be an env copy below copies=%d, got %r" % (copies, target))
    stream = target * len(agents) + agents.index(agent)
    name = wording.stream_name(stream, agents)

    def one(sub, fault):
        if fault in blind:
            return None, None
        report, injected = supersuit_rollout(env_fn, form, copies, num_cpus, steps, sub, fault, target, agent, at,
                                             seed)
        return report, injected.get(stream)

    def opportunity(fault, clean_dir):
        if fault in blind:
            return wording.SB3_FORM_BLIND, None
        term, trunc = clean_steps(clean_dir, target, stream)
        if fault == "agent:pad":
            return wording.never_left_early(name), None
        return no_opportunity(fault, term, trunc, at, name, lambda: limit)

    return run_check(one, faults, opportunity, directory, keep, steps, progress, agents, "stepledger-check-parallel-")


class _ParallelEnvFactory:
    """A picklable factory for ``MODULE.parallel_env(**kwargs)`` (for SuperSuit's worker processes)."""

    def __init__(self, module, kwargs):
        self.module, self.kwargs = module, kwargs

    def __call__(self):
        import importlib
        return importlib.import_module(self.module).parallel_env(**self.kwargs)


def parallel_env_factory(module, max_cycles=None):
    """A picklable factory for the PettingZoo env module ``module`` (``mpe2.simple_spread_v3``): its
    ``parallel_env(max_cycles=max_cycles)``, or ``parallel_env()`` where it takes no ``max_cycles``;
    refuses (ValueError, one line) a module that cannot make a parallel env."""
    import importlib
    try:
        if getattr(importlib.import_module(module), "parallel_env", None) is None:
            raise ValueError("it has no parallel_env()")
        factory = _ParallelEnvFactory(module, {} if max_cycles is None else {"max_cycles": max_cycles})
        try:
            env = factory()
        except TypeError as exc:
            if "max_cycles" not in str(exc):
                raise
            factory = _ParallelEnvFactory(module, {})
            env = factory()
        if not getattr(env, "possible_agents", None):
            raise ValueError("its parallel_env() has no possible_agents")
        env.close()
    except Exception as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError("cannot make parallel env %r: %s" % (module, text)) from None
    return factory


class _RegisteredEnv:
    """A picklable factory for a registered env id (for worker processes)."""

    def __init__(self, env_id, max_episode_steps):
        self.env_id, self.max_episode_steps = env_id, max_episode_steps

    def __call__(self, index):
        import gymnasium as gym
        return gym.make(self.env_id, max_episode_steps=self.max_episode_steps)


def registered_env(env_id, max_episode_steps=None):
    """A picklable factory for ``gym.make(env_id)``; refuses (ValueError, one line) an id that cannot be made."""
    import gymnasium as gym
    if max_episode_steps is not None and (max_episode_steps < 1):
        raise ValueError("max_episode_steps must be a positive int, got %r" % (max_episode_steps,))
    factory = _RegisteredEnv(env_id, max_episode_steps)
    try:
        factory(0).close()
    except (gym.error.Error, ImportError, ModuleNotFoundError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError("cannot make env %r: %s" % (env_id, text)) from None
    return factory
