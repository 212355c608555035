"""``check_parallel``: ``check_boundary`` for a PettingZoo parallel env through SuperSuit's vector envs."""

from __future__ import annotations

import os
from typing import Any, Callable, Hashable, Literal, Sequence

import numpy as np

from stepledger import wording
from stepledger.faults.check import CheckReport, clean_steps, faults_from, no_opportunity, run_check
from stepledger.faults.engine import MULTIAGENT_FAULTS, check_fault, read_record
from stepledger.pettingzoo.faults import FaultyParallelEnv
from stepledger.pettingzoo.parallel import LedgerParallelEnv, LedgerSuperSuitVecEnv, index_supersuit_copies
from stepledger.report.compare import compare

# SuperSuit's SB3 wrapper tells every end as a termination: these faults cannot show through it
SB3_FORM_BLIND = ("truncated:as-term", "terminated:as-trunc")

SUPERSUIT_FORMS = ("gymnasium", "sb3")


def supersuit_rollout(env_fn, form, copies, num_cpus, steps, directory, fault=None, target=0, agent=None, at=2,
                      seed=0, dose="one"):
    """One rollout of ``copies`` copies of ``env_fn()`` through SuperSuit's vector env of ``form``, with both
    ledgers (FaultyParallelEnv outside LedgerParallelEnv where ``fault``) and random actions; returns
    (compare's report, {stream: where the fault first struck it}), from each copy's record."""
    import supersuit as ss

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
            from stepledger.sb3.vec_env import LedgerVecEnv
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


def check_parallel(env_fn: Callable[[], Any], form: Literal["gymnasium", "sb3"] = "gymnasium", copies: int = 2,
                   num_cpus: int = 0, steps: int = 100, faults: Sequence[str] | None = None,
                   agent: Hashable | None = None, at: int = 2, target: int | None = None, seed: int = 0,
                   directory: str | os.PathLike[str] | None = None, keep: bool = False,
                   progress: Any = None) -> CheckReport:
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




class _AECEnvFactory:
    """A picklable factory for ``MODULE.env()``, a PettingZoo turn-based env."""

    def __init__(self, module):
        self.module = module

    def __call__(self):
        import importlib
        return importlib.import_module(self.module).env()


def aec_env_factory(module):
    """A factory for the turn-based env of PettingZoo env module ``module`` (``pettingzoo.classic.tictactoe_v3``):
    its ``env()``; refuses (ValueError, one line) a module that cannot make one."""
    import importlib
    try:
        if getattr(importlib.import_module(module), "env", None) is None:
            raise ValueError("it has no env()")
        env = _AECEnvFactory(module)()
        if not getattr(env, "possible_agents", None):
            raise ValueError("its env() has no possible_agents")
        env.close()
    except Exception as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError("cannot make turn-based env %r: %s" % (module, text)) from None
    return _AECEnvFactory(module)


def _api(args):
    """``--api``, or where it is not given: "parallel" for a module with parallel_env(), else "aec"."""
    api = getattr(args, "api", None)
    if api:
        return api
    import importlib
    try:
        module = importlib.import_module(args.env_id)
    except Exception:
        return "parallel"  # parallel_env_factory says what is wrong with the module
    has = lambda name: getattr(module, name, None) is not None  # noqa: E731
    return "aec" if has("env") and not has("parallel_env") else "parallel"


def check_from_cli(args, progress):
    """``stepledger check --trainer supersuit``: check_parallel on the env module ``args.env_id``; on a turn-based
    env (``--api aec``, or a module with no parallel_env(), such as PettingZoo's classic games), check_turns:
    ``--steps`` games through the hand-written agent_iter loop."""
    if _api(args) == "aec":
        from stepledger.faults.engine import TURN_FAULTS
        faults = faults_from(args.faults, TURN_FAULTS) if args.faults else None
        return check_turns(aec_env_factory(args.env_id), games=args.steps, faults=faults, agent=args.agent,
                           directory=args.dir, keep=args.keep, progress=progress)
    faults = faults_from(args.faults, MULTIAGENT_FAULTS) if args.faults else None
    env_fn = parallel_env_factory(args.env_id, args.max_episode_steps)
    return check_parallel(env_fn, form=args.form, copies=args.num_envs, num_cpus=args.num_cpus, steps=args.steps,
                          faults=faults, agent=args.agent, directory=args.dir, keep=args.keep, progress=progress)


def turn_rollout(env_fn, games, directory, fault=None, agent=None, at=2, seed=0, dose="one"):
    """``games`` games of ``env_fn()`` (a turn-based env) through the hand-written ``agent_iter`` loop, random
    legal moves (the action mask where the observation or the info has one), LedgerAECEnv on the env side and TurnLedger
    on the trainer side, FaultyAECEnv between them where ``fault``; returns (compare's report, where the fault
    first struck, or None)."""
    from stepledger.pettingzoo.aec import LedgerAECEnv, TurnLedger
    from stepledger.pettingzoo.faults import FaultyAECEnv

    env = LedgerAECEnv(env_fn(), directory, index=0)
    injector = None
    if fault is not None:
        env = injector = FaultyAECEnv(env, fault, agent=agent, dose=dose, at=at, seed=seed)
    agents = list(env.possible_agents)
    trainer_file = os.path.join(directory, "trainer.npz")
    turns = TurnLedger(trainer_file, agents, env.observation_space(agents[0]), env.action_space(agents[0]))
    rng = np.random.default_rng(seed)
    try:
        for game in range(games):
            env.reset(seed=seed + game)
            turns.new_game()  # a step the trainer was never handed (agent:no-last) is dropped on its side
            for who in env.agent_iter():
                obs, reward, term, trunc, info = env.last()
                turns.observed(who, obs, reward, term, trunc)
                action = None
                if not (term or trunc):
                    # the action mask: in the observation dict (PettingZoo's classic games) or in info (Shimmy's
                    # OpenSpiel games)
                    mask = (obs if isinstance(obs, dict) else info if isinstance(info, dict) else {}).get(
                        "action_mask")
                    space = env.action_space(who)
                    action = (int(rng.choice(np.flatnonzero(mask))) if mask is not None and np.any(mask)
                              else space.sample())
                turns.acted(who, action)
                env.step(action)
    finally:
        env.close()
        turns.close()
    return compare(directory, trainer_file), None if injector is None else injector.first


def check_turns(env_fn: Callable[[], Any], games: int = 6, faults: Sequence[str] | None = None,
                agent: Hashable | None = None, at: int = 2, seed: int = 0,
                directory: str | os.PathLike[str] | None = None, keep: bool = False,
                progress: Any = None) -> CheckReport:
    """``check_boundary`` for a PettingZoo turn-based env through the hand-written ``agent_iter`` loop.

    Each fault of ``faults`` (default: every one of ``faults.TURN_FAULTS``) is injected by FaultyAECEnv
    outside LedgerAECEnv, on agent ``agent`` (default: the last of possible_agents), at its first opportunity
    at or after that agent's step ``at``; the report says whether compare named the agent, episode, step and
    field.
    """
    from stepledger.faults.engine import TURN_FAULTS
    for name, value in (("games", games), ("at", at)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (1 if name == "games" else 0):
            raise ValueError("check_turns: %s must be a positive int, got %r" % (name, value))
    faults = list(TURN_FAULTS) if faults is None else [check_fault(f, TURN_FAULTS, "check_turns") for f in faults]
    probe = env_fn()
    try:
        agents = list(probe.possible_agents)
    finally:
        probe.close()
    agent = agents[-1] if agent is None else agent
    if agent not in agents:
        raise ValueError("check_turns: agent %r is not one of possible_agents %r" % (agent, agents))
    stream = agents.index(agent)
    name = wording.stream_name(stream, agents)

    def one(sub, fault):
        return turn_rollout(env_fn, games, sub, fault, agent, at, seed)

    def opportunity(fault, clean_dir):
        term, trunc = clean_steps(clean_dir, 0, stream)
        return no_opportunity(fault, term, trunc, at, name, lambda: None)

    return run_check(one, faults, opportunity, directory, keep, games, progress, agents, "stepledger-check-turns-")
