"""The live check of per-env events (``TrainerLedger.env_reset(..., token)``, ``env_steps(..., tokens)``), as a
trainer that records an env's events many at a time uses it (stepledger.rllib's runners), and its counts
(``live_metrics``), on both cores."""

import gymnasium as gym
import numpy as np
import pytest

from stepledger import LedgerEnv, TrainerLedger
from stepledger.faults import FaultyEnv, read_record
from stepledger.format import schema as S
from stepledger.recording.live import METRIC_CHECKED, METRIC_FAULTS


def _episodes(env, n_episodes, seed=0):
    """Per episode: (reset obs, reset token, actions, obs, rewards, terminated, truncated, step tokens)."""
    out = []
    env.action_space.seed(seed)
    for k in range(n_episodes):
        obs0, info = env.reset(seed=seed + k)
        acts, obs, rews, te, tr, toks = [], [], [], [], [], []
        while True:
            a = env.action_space.sample()
            o, r, t, u, inf = env.step(a)
            acts.append(a), obs.append(o), rews.append(r), te.append(t), tr.append(u), toks.append(inf.get(S.TOKEN_KEY))
            if t or u:
                break
        out.append((obs0, info.get(S.TOKEN_KEY), np.array(acts), np.array(obs), np.array(rews), te, tr, toks))
    return out


def _check(episodes, chunk=7):
    led = TrainerLedger(None, 2, gym.spaces.Box(-8, 8, (3,), np.float32), gym.spaces.Box(-2, 2, (1,), np.float32),
                        live=True, on_fault="record")
    for obs0, tok0, acts, obs, rews, te, tr, toks in episodes:
        led.env_reset(1, obs0, tok0)
        for s in range(0, len(rews), chunk):  # many steps at a time, as episode chunks come
            led.env_steps(1, acts[s:s + chunk], obs[s:s + chunk], rews[s:s + chunk], te[s:s + chunk],
                          tr[s:s + chunk], toks[s:s + chunk])
    return led


def test_env_steps_with_tokens_find_the_fault_at_its_event(tmp_path, core_impl):
    record = str(tmp_path / "fault.json")
    env = FaultyEnv(LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=30), None, index=1, live=True),
                    "reward:f16", index=1, at=40, target=1, record=record)
    episodes = _episodes(env, 3)
    led = _check(episodes)
    injected = read_record(record)
    (fault,) = led.live_faults
    assert (fault.env, fault.episode, fault.step, fault.fields) == (1, injected["episode"], injected["step"],
                                                                    ("reward",))
    events = sum(1 + len(e[4]) for e in episodes)
    assert led.live_metrics() == {METRIC_FAULTS: 1, METRIC_CHECKED: events}


def test_env_steps_with_tokens_of_a_clean_run_and_a_missing_token(core_impl):
    env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=20), None, index=1, live=True)
    episodes = _episodes(env, 2)
    led = _check(episodes)
    assert led.live_faults == [] and led.live_metrics() == {METRIC_FAULTS: 0, METRIC_CHECKED: 42}
    # a step that came without its token, tokens having arrived: a step the env never took
    obs0, tok0, acts, obs, rews, te, tr, toks = episodes[1]
    toks = list(toks)
    toks[4] = None
    led = _check([episodes[0], (obs0, tok0, acts, obs, rews, te, tr, toks)])
    (fault,) = led.live_faults
    assert (fault.episode, fault.step, fault.fields) == (1, 5, ("kind",))


def test_without_live_the_tokens_are_not_looked_at():
    led = TrainerLedger(None, 1, gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2), live=True)
    with pytest.warns(UserWarning, match="live"):
        led.env_steps(0, [1], [[0.0]], [1.0], [False], [False], [None])  # no token ever: one warning, no fault
    assert led.live_faults == [] and led.live_metrics()[METRIC_CHECKED] == 0
