"""The fault engine itself: every fault under every adapter strikes where it says it struck.

Each adapter (FaultyEnv in the env stack; FaultyVectorEnv under NEXT_STEP and
SAME_STEP; FaultyVecEnv in SB3's DummyVecEnv) runs every fault it supports on
scripted envs whose episodes end by termination and by truncation. The
position the engine recorded must be the one the dose rule gives, worked out
here from the env's script alone, and compare must name that env, episode,
step and exactly the fault's field; every other env compares clean. The
tests of the detection matrix check the same through worker processes; these
run in-process, for every fault on the trainer-side adapters as well.
"""

import functools
import os
import warnings

import gymnasium as gym
import numpy as np
import pytest

from stepledger import LedgerEnv, LedgerVectorEnv, compare
from stepledger.check import is_located
from stepledger.faults import ENV_SIDE_FAULTS, TRAINER_SIDE_FAULTS, FaultEngine, FaultyEnv, FaultyVectorEnv
from trainer_envs import ScriptedEnv

N_ENVS, STEPS, AT, TARGET = 3, 40, 6, 1
LENGTHS, ENDS = (4, 5, 3, 6), ("term", "trunc", "trunc", "term")
ADAPTERS = ("env", "vector-next", "vector-same", "sb3")

# The fields compare must name at the struck event: exactly these.
FIELDS = {"obs": {"obs"}, "final-obs": {"obs"}, "action": {"action"}, "reward": {"reward"},
          "terminated:spurious": {"terminated"}, "truncated:as-term": {"terminated", "truncated"},
          "truncated:drop": {"truncated"}, "terminated:drop": {"terminated"},
          "terminated:as-trunc": {"terminated", "truncated"}}


def expected_fields(fault, adapter):
    """The fields compare names at the struck event: exactly these, under every adapter."""
    return FIELDS.get(fault) or FIELDS[fault.split(":")[0]]


def _faults(adapter):
    return ENV_SIDE_FAULTS if adapter == "env" else TRAINER_SIDE_FAULTS


def _script():
    """Each step of an env's life from its script: (episode, step, terminated, truncated)."""
    out, episode = [], 0
    while len(out) < STEPS:
        n, end = LENGTHS[episode % len(LENGTHS)], ENDS[episode % len(ENDS)]
        for t in range(1, n + 1):
            out.append((episode, t, t == n and end == "term", t == n and end == "trunc"))
        episode += 1
    return out


# Where each fault can change something, from a step's true flags; the value faults not named here
# can change any step (every obs, action and reward of these envs is random).
OPPORTUNITY = {"obs": lambda te, tr: not (te or tr), "final-obs": lambda te, tr: te or tr,
               "terminated:spurious": lambda te, tr: not (te or tr), "truncated:as-term": lambda te, tr: tr,
               "truncated:drop": lambda te, tr: tr, "terminated:drop": lambda te, tr: te,
               "terminated:as-trunc": lambda te, tr: te}


def expected_strike(fault, at=AT):
    """Where a fault first strikes an env: its first step at or after step counter ``at`` the fault can change."""
    can = OPPORTUNITY.get(fault) or OPPORTUNITY.get(fault.split(":")[0]) or (lambda te, tr: True)
    for cell, (episode, step, te, tr) in enumerate(_script()):
        if cell >= at and can(te, tr):
            return episode, step
    raise AssertionError("no opportunity for %s in the script" % fault)


def _ledgered(directory, i, fault, dose, obs="box32"):
    env = LedgerEnv(ScriptedEnv(obs=obs, lengths=LENGTHS, ends=ENDS, seed=100 + i), directory, index=i)
    return FaultyEnv(env, fault, index=i, dose=dose, at=AT, target=TARGET) if fault else env


class SplitFinalObs(gym.vector.VectorWrapper):
    """A vector env whose info merging lacks Gymnasium's case for final_obs: a dict obs becomes a dict of arrays."""

    def step(self, actions):
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        if "final_obs" in info:
            info = dict(info)
            finals, mask = info.pop("final_obs"), info["_final_obs"]
            first = next(f for f in finals if f is not None)
            split = {k: np.stack([finals[i][k] if mask[i] else np.zeros_like(first[k]) for i in range(len(mask))])
                     for k in first}
            split.update({"_" + k: mask.copy() for k in first})
            info["final_obs"] = split
        return obs, rewards, terminated, truncated, info


def run(directory, adapter, fault, dose="one", obs="box32", split_finals=False):
    """One in-process run through ``adapter`` with ``fault``; returns (report, {env: where it struck})."""
    directory = str(directory)
    env_fault = fault if adapter == "env" else None
    fns = [functools.partial(_ledgered, directory, i, env_fault, dose, obs) for i in range(N_ENVS)]
    trainer_file = os.path.join(directory, "trainer.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # step-after-done and missing-final warnings from faulty flags
        if adapter == "sb3":
            from stable_baselines3.common.vec_env import DummyVecEnv

            from stepledger.faults import FaultyVecEnv
            venv = inner = DummyVecEnv(fns)
            wrap = functools.partial(FaultyVecEnv, venv)
        else:
            mode = gym.vector.AutoresetMode.SAME_STEP if adapter == "vector-same" else gym.vector.AutoresetMode.NEXT_STEP
            venv = inner = gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
            if split_finals:
                venv = SplitFinalObs(venv)
            wrap = functools.partial(FaultyVectorEnv, venv)
        injectors = list(inner.envs) if fault and adapter == "env" else []
        if fault and adapter != "env":
            venv = wrap(fault, dose=dose, at=AT, target=TARGET)
            injectors = [venv]
        if adapter == "sb3":
            from stepledger.sb3 import LedgerVecEnv
            venv = LedgerVecEnv(venv, trainer_file)
            space = venv.action_space
        else:
            venv = LedgerVectorEnv(venv, trainer_file)
            space = venv.single_action_space
        space.seed(5)
        try:
            venv.reset()
            for _ in range(STEPS):
                venv.step(np.stack([space.sample() for _ in range(N_ENVS)]))
        finally:
            venv.close()
    struck = {}
    for injector in injectors:
        struck.update(injector.where.by_env)
    return compare(directory, trainer_file), struck


def _check(report, struck, fault, adapter):
    by_env = report.by_env()
    assert set(by_env) == set(struck), "compare found differences in envs %s, the fault struck %s:\n%s" % (
        sorted(by_env), sorted(struck), report)
    for env, where in struck.items():
        d = by_env[env]
        assert is_located(d, where), "struck %s, compare said: %s" % (where, d.line())
        if fault != "step:fill":
            assert (d.what, d.episode, d.step) == ("fields", where["episode"], where["step"]), d.line()
            assert set(d.fields) == expected_fields(fault, adapter), d.line()


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_clean_without_fault(tmp_path, adapter):
    report, struck = run(tmp_path, adapter, None)
    assert report.ok and len(report.envs) == N_ENVS and not struck, str(report)


@pytest.mark.parametrize("adapter,fault", [(a, f) for a in ADAPTERS for f in _faults(a)])
def test_fault_strikes_at_its_recorded_place(tmp_path, adapter, fault):
    report, struck = run(tmp_path, adapter, fault)
    assert list(struck) == [TARGET], struck
    where = struck[TARGET]
    assert where["fault"] == fault and where["env"] == TARGET
    assert where["field"] == {"final-obs": "obs"}.get(fault.split(":")[0], fault.split(":")[0])
    if fault != "action:clip":  # clip waits for an action outside half the range: anywhere after
        assert (where["episode"], where["step"]) == expected_strike(fault), where
    _check(report, struck, fault, adapter)


@pytest.mark.parametrize("adapter,fault", [(a, f) for a in ADAPTERS for f in ("obs:swap", "final-obs:stale",
                                                                              "reward:f16", "truncated:drop")
                                           if f in _faults(a)])
def test_dose_all_strikes_every_env_and_records_each_first(tmp_path, adapter, fault):
    report, struck = run(tmp_path, adapter, fault, dose="all")
    assert sorted(struck) == list(range(N_ENVS))
    for where in struck.values():  # from the first step
        assert (where["episode"], where["step"]) == expected_strike(fault, at=0), where
    _check(report, struck, fault, adapter)


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("fault", ("obs:zero", "final-obs:f16", "terminated:spurious"))
def test_dict_observations(tmp_path, adapter, fault):
    """Dict observations: each key's row is changed; under SAME_STEP the final obs in info["final_obs"]."""
    report, struck = run(tmp_path, adapter, fault, obs="dict")
    assert list(struck) == [TARGET]
    _check(report, struck, fault, adapter)


@pytest.mark.parametrize("fault", ("final-obs:zero", "terminated:spurious"))
def test_final_obs_split_into_a_dict_of_arrays(tmp_path, fault):
    """SAME_STEP's final_obs as a dict of arrays with _key masks: the fault writes env i's row of each key."""
    report, struck = run(tmp_path, "vector-same", fault, obs="dict", split_finals=True)
    assert list(struck) == [TARGET] and (struck[TARGET]["episode"], struck[TARGET]["step"]) == expected_strike(fault)
    _check(report, struck, fault, "vector-same")


def test_unknown_fault_is_refused_by_name():
    with pytest.raises(ValueError, match="FaultyVectorEnv: unknown or unsupported fault 'step:fill'"):
        FaultyVectorEnv(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")]), "step:fill")
    with pytest.raises(ValueError, match="FaultyEnv: unknown or unsupported fault 'obs:swap'"):
        FaultyEnv(gym.make("CartPole-v1"), "obs:swap", index=0)


# ---------------------------------------------------------------- the engine driven per env and per agent


def test_engine_driven_by_feedback_alone():
    """A trainer component that sees only resets and feedback (an env-to-module connector) drives reset and step."""
    eng = FaultEngine("reward:zero", at=4, target=2)
    for env in (0, 2):
        eng.reset(env, np.zeros(2, np.float32))
    got = []
    for t in range(1, 9):
        for env in (0, 2):
            done = t == 5
            out = eng.step(env, np.full(2, t, np.float32), -1.5, done, False)
            got.append((env, t, out[1]))
            if done:
                eng.reset(env, np.zeros(2, np.float32))
    # the 5th step of env 2 (cell 4) is the first drawn: episode 0, step 5
    assert eng.first == {"env": 2, "episode": 0, "step": 5, "fault": "reward:zero", "field": "reward"}
    assert [g for g in got if g[2] != -1.5] == [(2, 5, 0.0)]
    assert eng.position(2) == (1, 3) and not eng.awaiting_reset(2)


def test_engine_per_agent_streams():
    """Per-agent calls: a stream per (env, agent), the dose narrowed to one agent, the agent recorded."""
    eng = FaultEngine("obs:zero", at=2, target=1, target_agent="agent_1")
    obs = np.ones(3, np.float32)
    for agent in ("agent_0", "agent_1"):
        eng.reset(1, obs, agent=agent)
    hits = []
    for t in range(1, 6):
        for agent in ("agent_0", "agent_1"):
            out = eng.step(1, obs * t, 0.0, False, False, agent=agent)
            if out[0] is not None and not np.array_equal(out[0], obs * t):
                hits.append((agent, t))
    assert hits == [("agent_1", 3)]
    assert eng.first == {"env": 1, "episode": 0, "step": 3, "fault": "obs:zero", "field": "obs", "agent": "agent_1"}
    # fractional doses draw per agent: two agents of one env do not share their cells
    a, b = (FaultEngine("reward:zero", dose=0.5, seed=3) for _ in range(2))
    draws = {ag: [a.dose.draw(0, c, agent=ag) for c in range(64)] for ag in ("agent_0", "agent_1")}
    assert draws["agent_0"] != draws["agent_1"]
    assert draws["agent_0"] == [b.dose.draw(0, c, agent="agent_0") for c in range(64)]


def test_engine_next_step_reset_is_not_a_step():
    """awaiting_reset marks the step a NEXT_STEP vector env spends on a reset; positions skip it."""
    eng = FaultEngine("obs:zero", dose="all")
    eng.reset(0, np.ones(1))
    eng.step(0, np.ones(1), 1.0, False, True)
    assert eng.awaiting_reset(0) and eng.position(0) == (0, 1)
    eng.reset(0, np.ones(1))
    assert not eng.awaiting_reset(0) and eng.position(0) == (1, 0)
    eng.step(0, np.ones(1), 1.0, False, False)
    assert eng.where.by_env[0]["episode"] == 1 and eng.where.by_env[0]["step"] == 1


# ---------------------------------------------------------------- an env-side injector whose index comes later


def _unindexed(directory, i, fault):
    env = LedgerEnv(ScriptedEnv(lengths=LENGTHS, ends=ENDS, seed=100 + i), directory)  # index: the trainer's link
    return FaultyEnv(env, fault, at=AT, target=TARGET)  # index: the LedgerEnv's, at the first reset


@pytest.mark.parametrize("fault", ("obs:zero", "terminated:drop"))
def test_env_side_index_taken_from_the_ledger_inside(tmp_path, fault):
    """Without index=, FaultyEnv strikes and records as env i, i the index its LedgerEnv was given later."""
    directory, trainer_file = str(tmp_path), os.path.join(str(tmp_path), "trainer.npz")
    inner = gym.vector.SyncVectorEnv([functools.partial(_unindexed, directory, i, fault) for i in range(N_ENVS)])
    envs = LedgerVectorEnv(inner, trainer_file)
    envs.single_action_space.seed(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        envs.reset()
        for _ in range(STEPS):
            envs.step(np.stack([envs.single_action_space.sample() for _ in range(N_ENVS)]))
        envs.close()
    assert [e.index for e in inner.envs] == list(range(N_ENVS))
    struck = {k: v for e in inner.envs for k, v in e.where.by_env.items()}
    assert list(struck) == [TARGET] and (struck[TARGET]["episode"], struck[TARGET]["step"]) == expected_strike(fault)
    _check(compare(directory, trainer_file), struck, fault, "env")


def test_env_side_without_any_index_is_refused_at_reset():
    env = FaultyEnv(gym.make("CartPole-v1"), "obs:zero")
    with pytest.raises(ValueError, match=r"^FaultyEnv: no index= and no LedgerEnv inside that knows its index"):
        env.reset()


def test_a_fraction_hits_the_same_cells_under_every_adapter(tmp_path):
    """Cells are an env's steps, drawn from a generator of the seed and the env: the adapter does not matter."""
    fault, firsts = "final-obs:zero", {}
    for adapter in ADAPTERS:
        report, struck = run(tmp_path / adapter, adapter, fault, dose=0.3)
        _check(report, struck, fault, adapter)
        firsts[adapter] = {env: (w["episode"], w["step"]) for env, w in struck.items()}
    assert len(firsts["env"]) == N_ENVS and all(f == firsts["env"] for f in firsts.values()), firsts


# Which steps each fault may strike, by its true flags, as docs/FAULTS.md states them.
STRIKES_AT = {"obs": lambda te, tr: not (te or tr), "final-obs": lambda te, tr: te or tr,
              "reward": lambda te, tr: True, "terminated:spurious": lambda te, tr: not (te or tr),
              "truncated:as-term": lambda te, tr: tr and not te, "truncated:drop": lambda te, tr: tr and not te,
              "terminated:drop": lambda te, tr: te, "terminated:as-trunc": lambda te, tr: te}


@pytest.mark.parametrize("fault", [f for f in TRAINER_SIDE_FAULTS if not f.startswith("action")])
def test_engine_strikes_only_a_step_its_fault_can_change(fault):
    rule = STRIKES_AT.get(fault) or STRIKES_AT[fault.split(":")[0]]
    for te, tr in ((False, False), (True, False), (False, True), (True, True)):
        eng = FaultEngine(fault, at=1, target=0)
        eng.reset(0, np.full(2, 0.3, np.float32))
        eng.step(0, np.full(2, 0.2, np.float32), 0.7, False, False)  # cell 0: before at
        out = eng.step(0, np.full(2, 0.1, np.float32), -1.3, te, tr, other=(np.full(2, 0.9, np.float32), 4.1))
        assert (eng.first is not None) == rule(te, tr), (te, tr, eng.first)
        assert (out[0] is not None and not np.array_equal(out[0], np.full(2, 0.1, np.float32))
                or out[1] != -1.3 or out[2:] != (te, tr)) == rule(te, tr), (te, tr, out)
        if eng.first is not None:
            assert (eng.first["episode"], eng.first["step"]) == (0, 2)
