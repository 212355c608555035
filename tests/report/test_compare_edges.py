"""compare's less common paths: the first difference over several columns, the first differing element
of a kept value when several differ, and NaN in kept values."""

import functools
import itertools
import os

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces as gs

from stepledger import LedgerEnv, LedgerVectorEnv, compare
from stepledger import core
from stepledger.format import schema as S

import envs_for_tests as E

N = 40


def _columns(n=N):
    rng = np.random.default_rng(7)
    return {"kind": np.ones(n, np.uint8), "h_obs": rng.integers(0, 2 ** 63, n, dtype=np.uint64),
            "h_act": rng.integers(0, 2 ** 63, n, dtype=np.uint64),
            "h_rew": rng.integers(0, 2 ** 63, n, dtype=np.uint64),
            "terminated": np.zeros(n, np.bool_), "truncated": np.zeros(n, np.bool_)}


def _changed(a, changes):
    b = {k: v.copy() for k, v in a.items()}
    for name, i in changes:
        b[name][i] = (not b[name][i]) if b[name].dtype == np.bool_ else (b[name][i] ^ np.uint64(1) if
                                                                         b[name].dtype == np.uint64 else 0)
    return b


@pytest.mark.parametrize("first, second", list(itertools.permutations(S.EVENT_COLUMN_NAMES, 2)))
def test_first_difference_is_the_earliest_over_every_column(core_impl, first, second):
    """Two columns differ at different events: the earlier event is the first difference, whichever
    column is searched first."""
    a = _columns()
    for early, late in ((3, 17), (17, 3)):
        b = _changed(a, [(first, early), (second, late)])
        assert core.first_difference(a, b) == 3, (first, early, second, late)
        assert core.first_difference(a, b, 4) == 17  # from a start after the earlier one
        assert core.first_difference(a, b, 18) == -1


@pytest.mark.parametrize("name", S.EVENT_COLUMN_NAMES)
def test_first_difference_in_a_column_that_differs_at_several_events(core_impl, name):
    a = _columns()
    b = _changed(a, [(name, 30), (name, 6), (name, 21)])
    assert core.first_difference(a, b) == 6
    assert core.first_difference(a, b, 7) == 21


def test_first_difference_with_many_columns_at_many_events(core_impl):
    rng = np.random.default_rng(11)
    a = _columns(500)
    for _ in range(50):
        events = rng.choice(500, size=len(S.EVENT_COLUMN_NAMES), replace=False)
        b = _changed(a, list(zip(S.EVENT_COLUMN_NAMES, events)))
        assert core.first_difference(a, b) == int(events.min())
        start = int(np.sort(events)[2])
        assert core.first_difference(a, b, start) == start


# ---------------------------------------------------------------- kept values: which element

BOX = gs.Box(-np.inf, np.inf, (2, 3), np.float32)


class EditObs(gym.vector.VectorWrapper):
    """Changes env 0's observation at the ``at``-th step: ``edit(obs_row)`` in place."""

    def __init__(self, env, at, edit):
        super().__init__(env)
        self.at, self.edit, self.t = at, edit, 0

    def step(self, actions):
        obs, rew, term, trunc, info = self.env.step(actions)
        self.t += 1
        if self.t == self.at:
            obs = obs.copy()
            self.edit(obs[0])
        return obs, rew, term, trunc, info


def _scripted(directory, i, steps):
    env = E.ScriptedEnv(BOX, gs.Discrete(2), np.zeros((2, 3), np.float32), steps)
    return LedgerEnv(env, directory, index=i, keep_values=True)


def _first_element_report(tmp_path, obs, edit):
    d = str(tmp_path)
    steps = [(np.array(obs, np.float32).reshape(2, 3), 1.0, False, False)]
    venv = EditObs(gym.vector.SyncVectorEnv([functools.partial(_scripted, d, 0, steps)]), at=3, edit=edit)
    trainer = os.path.join(d, "trainer.npz")
    envs = LedgerVectorEnv(venv, trainer, keep_values=True)
    envs.reset(seed=0)
    for _ in range(5):
        envs.step(np.zeros(1, np.int64))
    envs.close()
    report = compare(d, trainer)
    d0 = report.by_env()[0]
    assert (d0.episode, d0.step, d0.fields) == (0, 3, ("obs",)), str(report)
    return d0


def _set(*cells):
    def edit(row):
        for (r, c), v in cells:
            row[r, c] = v
    return edit


def test_the_first_differing_element_when_several_differ(tmp_path, core_impl):
    obs = [[1, 2, 3], [4, 5, 6]]
    d = _first_element_report(tmp_path, obs, _set(((0, 2), 9), ((1, 0), 9), ((1, 2), 9)))
    assert d.detail == {"obs": "[0, 2]"}  # the first in order, not the last or any other
    assert "first at [0, 2]" in d.line()
    assert d.to_dict()["first_element"] == {"obs": "[0, 2]"}


def test_nan_kept_alike_on_both_sides_is_not_a_difference(tmp_path, core_impl):
    """NaN equals NaN in kept values: the first differing element is after it."""
    obs = [[np.nan, 2, 3], [np.nan, 5, 6]]
    d = _first_element_report(tmp_path, obs, _set(((1, 1), 7), ((1, 2), 8)))
    assert d.detail == {"obs": "[1, 1]"}
    assert "nan" in d.line() and "first at [1, 1]" in d.line()


def test_nan_against_a_number_is_a_difference(tmp_path, core_impl):
    obs = [[1, 2, np.nan], [4, 5, 6]]
    d = _first_element_report(tmp_path, obs, _set(((0, 2), 0.5), ((1, 2), 0.25)))
    assert d.detail == {"obs": "[0, 2]"}
    (tmp_path / "b").mkdir()
    d = _first_element_report(tmp_path / "b", [[1, 2, 3], [4, 5, 6]], _set(((1, 0), np.nan)))
    assert d.detail == {"obs": "[1, 0]"}
