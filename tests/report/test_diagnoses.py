"""Reports that name the cause: wrong or duplicate index, wrappers inside the trainer-side ledger, TimeLimit
outside LedgerEnv, where systematic differences fall (--all), and live mode with other settings."""

import functools
import os
import warnings

import gymnasium as gym
import numpy as np
import pytest

from stepledger import BoundaryFault, LedgerEnv, LedgerVectorEnv, compare
from stepledger.cli.main import main
from stepledger.errors import SettingsError
from stepledger.faults import FaultyEnv
from stepledger.recording.placement import outer_env_wrappers, value_changing_wrappers

INDEX_Q = "is index= each env's position in the vector env?"
PLACE = "put the trainer-side ledger innermost, directly around the vector env, and LedgerEnv outermost in the worker"
NOT_CHECKED = "no longer checked (a fault in it would no longer show)"
FIELD_WORDS = {"obs": "observations", "reward": "rewards", "action": "actions"}


def _env(i, d, index, limit=10, fault=None, dose="one", at=3, live=False, outer_limit=None, fault_env=None, **kw):
    env = gym.make("Pendulum-v1", max_episode_steps=limit) if outer_limit is None else \
        gym.make("Pendulum-v1", max_episode_steps=None)
    env = LedgerEnv(env, d, index=index, live=live, **kw)
    if outer_limit is not None:  # a TimeLimit outside LedgerEnv: the env side never sees the episode end
        env = gym.wrappers.TimeLimit(env, outer_limit)
    if fault is not None and fault_env in (None, i):
        env = FaultyEnv(env, fault, index=i, dose=dose, at=at, target=i)
    return env


def run(d, indices=None, n=3, steps=25, wrap=None, seed=0, vector=gym.vector.SyncVectorEnv, live=False,
        trainer_kw=None, **env_kw):
    indices = list(range(n)) if indices is None else indices
    fns = [functools.partial(_env, i, d, indices[i], live=live, **env_kw) for i in range(len(indices))]
    envs = vector(fns)
    if wrap is not None:
        envs = wrap(envs)
    trainer = os.path.join(d, "trainer.npz") if d is not None else None
    envs = LedgerVectorEnv(envs, trainer, live=live, **(trainer_kw or {}))
    envs.single_action_space.seed(seed)
    acts = [np.stack([envs.single_action_space.sample() for _ in range(len(indices))]) for _ in range(steps)]
    envs.reset(seed=seed)
    for a in acts:
        envs.step(a)
    envs.close()
    return d, trainer


# ---------------------------------------------------------------- index

def test_swapped_indices_are_named(tmp_path):
    d, t = run(str(tmp_path), indices=[1, 0, 2])
    report = compare(d, t)
    lines = str(report).splitlines()
    assert lines[-1] == "hint: env-0.npz matches the trainer's env 1 and env-1.npz its env 0: " + INDEX_Q
    assert "2 of 3 envs differ" in lines
    assert report.to_dict()["hints"] == [lines[-1]]


def test_off_by_one_indices_are_named(tmp_path):
    d, t = run(str(tmp_path), indices=[1, 2, 3])
    lines = str(compare(d, t)).splitlines()
    assert lines[-1] == ("hint: env-1.npz matches the trainer's env 0, env-2.npz its env 1 and env-3.npz its env 2: "
                         + INDEX_Q)


def test_duplicate_index_is_named(tmp_path):
    # envs 1 and 2 both say index=1: the second to write records env-1.dup-*.npz beside env-1.npz
    # (issue 12: nothing is overwritten), and compare names both
    d, t = run(str(tmp_path), indices=[0, 1, 1])
    lines = str(compare(d, t)).splitlines()
    dups = [n for n in os.listdir(d) if n.startswith("env-1.dup-")]
    assert len(dups) == 1
    assert ("%s and env-1.npz both recorded env 1 at the same time: two LedgerEnvs were given index=1; %s was not "
            "compared" % (dups[0], dups[0])) in lines


def test_a_real_fault_gets_no_index_hint(tmp_path):
    d, t = run(str(tmp_path), fault="obs:zero", at=0, fault_env=1)
    text = str(compare(d, t))
    assert text.splitlines()[0].startswith("env 1, episode 0, step 1: obs differs")
    assert "index=" not in text and "hint: all" not in text


def test_live_swapped_indices_are_named_at_the_first_token(tmp_path):
    with pytest.raises(BoundaryFault) as err:
        run(None, indices=[1, 0], live=True)
    assert str(err.value) == ("the live tokens of index=1 arrive as the trainer's env 0 and those of index=0 as "
                              "its env 1: " + INDEX_Q)
    assert err.value.fields == ("index",)


def test_live_duplicate_index_is_named(tmp_path):
    with pytest.raises(BoundaryFault) as err:
        run(None, indices=[0, 1, 1], live=True)
    assert str(err.value) == ("env 2 receives the live tokens of LedgerEnv(index=1), as env 1 does: two envs were "
                              "given index=1; " + INDEX_Q)


# ---------------------------------------------------------------- wrappers inside the trainer-side ledger

@pytest.mark.parametrize("wrapper, field", [
    (lambda e: gym.wrappers.vector.NormalizeReward(e), "reward"),
    (lambda e: gym.wrappers.vector.NormalizeObservation(e), "obs"),
    (lambda e: gym.wrappers.vector.ClipReward(e, -1e-3, 0.0), "reward"),
    (lambda e: gym.wrappers.vector.TransformReward(e, lambda r: 2 * r), "reward"),
    (lambda e: gym.wrappers.vector.RescaleAction(e, -0.5, 0.5), "action"),
    (lambda e: gym.wrappers.vector.RescaleObservation(e, -1.0, 1.0), "obs"),
])
def test_gymnasium_wrapper_inside_the_ledger_warns_once_and_compare_hints(tmp_path, wrapper, field):
    name = type(wrapper(gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1")]))).__name__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d, t = run(str(tmp_path), wrap=wrapper, steps=5)
    ours = [w for w in caught if "check_wrappers=False" in str(w.message)]
    assert len(ours) == 1
    assert str(ours[0].message).startswith("LedgerVectorEnv: %s sits between this ledger and the vector env and "
                                           "changes values on purpose" % name)
    assert "%s(LedgerVectorEnv(envs, path))" % name in str(ours[0].message)
    lines = str(compare(d, t)).splitlines()
    assert "3 of 3 envs differ" in lines
    assert lines[-1] == ("hint: all 3 envs differ in %s from their first events: %s, between the two ledgers, changes "
                         "%s on purpose; if that change is all there is, %s; what %s then does is %s"
                         % (field, name, FIELD_WORDS[field], PLACE, name, NOT_CHECKED)), lines


def test_check_wrappers_false_silences_the_warning(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(str(tmp_path), wrap=gym.wrappers.vector.NormalizeReward, steps=2, trainer_kw={"check_wrappers": False})
    assert not [w for w in caught if "check_wrappers" in str(w.message)]


@pytest.mark.parametrize("check", [True, False])
def test_a_wrapper_around_ledgerenv_in_the_vector_envs_warns(tmp_path, check):
    # Gymnasium's frame stacking has a single-env form only: in a SyncVectorEnv's envs, outside LedgerEnv,
    # it sits between the two ledgers as surely as a vector wrapper inside the trainer-side ledger
    def make(i):
        return gym.wrappers.FrameStackObservation(LedgerEnv(gym.make("Pendulum-v1"), str(tmp_path), index=i), 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([functools.partial(make, i) for i in range(2)]),
                               str(tmp_path / "trainer.npz"), check_wrappers=check)
    ours = [str(w.message) for w in caught if "check_wrappers=False" in str(w.message)]
    envs.close()
    if not check:
        assert ours == []
        return
    assert ours == ["LedgerVectorEnv: FrameStackObservation wraps LedgerEnv in the vector env's envs and changes "
                    "values on purpose, so the envs will differ from their first events; " + PLACE +
                    " (e.g. LedgerEnv(FrameStackObservation(env), directory, index=i)): what it then does, part of "
                    "the env, is " + NOT_CHECKED + "; or pass check_wrappers=False if you mean to check through it"]


def test_wrappers_inside_ledgerenv_are_not_named(tmp_path):
    envs = gym.vector.SyncVectorEnv([lambda: LedgerEnv(gym.wrappers.NormalizeReward(gym.make("Pendulum-v1")),
                                                       str(tmp_path), index=0)])
    assert outer_env_wrappers(envs) == []  # inside LedgerEnv: on the env side, recorded as the trainer gets it
    bare = gym.vector.SyncVectorEnv([lambda: gym.wrappers.NormalizeReward(gym.make("Pendulum-v1"))])
    assert outer_env_wrappers(bare) == []  # no LedgerEnv in this process: nothing known of where it is
    envs.close()
    bare.close()


def test_wrappers_that_only_watch_are_not_named():
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1")])
    assert value_changing_wrappers(gym.wrappers.vector.RecordEpisodeStatistics(envs)) == []
    stacked = gym.wrappers.vector.RescaleAction(gym.wrappers.vector.RecordEpisodeStatistics(
        gym.wrappers.vector.NormalizeObservation(envs)), -0.5, 0.5)
    assert value_changing_wrappers(stacked) == ["RescaleAction", "NormalizeObservation"]
    envs.close()


@pytest.mark.parametrize("name", ["VecNormalize", "VecFrameStack", "VecTransposeImage"])
def test_sb3_wrapper_inside_the_ledger_warns(tmp_path, name):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common import vec_env as V

    from stepledger.sb3 import LedgerVecEnv
    if name == "VecTransposeImage":
        def make():
            return gym.wrappers.TransformObservation(
                gym.make("CartPole-v1"), lambda o: np.zeros((8, 8, 3), np.uint8),
                gym.spaces.Box(0, 255, (8, 8, 3), np.uint8))
        inner = V.VecTransposeImage(V.DummyVecEnv([make]))
    else:
        base = V.DummyVecEnv([lambda: gym.make("Pendulum-v1")])
        inner = V.VecNormalize(base) if name == "VecNormalize" else V.VecFrameStack(base, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        venv = LedgerVecEnv(inner, str(tmp_path / "trainer.npz"))
    ours = [w for w in caught if "check_wrappers=False" in str(w.message)]
    assert len(ours) == 1 and str(ours[0].message).startswith("LedgerVecEnv: %s sits between" % name)
    venv.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LedgerVecEnv(V.DummyVecEnv([lambda: gym.make("Pendulum-v1")]), str(tmp_path / "t2.npz")).close()
    assert not [w for w in caught if "check_wrappers" in str(w.message)]


def test_sb3_vecnormalize_inside_the_ledger_compare_hint(tmp_path):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from stepledger.sb3 import LedgerVecEnv
    d = str(tmp_path)
    venv = VecNormalize(DummyVecEnv([functools.partial(_env, i, d, i) for i in range(2)]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        venv = LedgerVecEnv(venv, os.path.join(d, "trainer.npz"))
    venv.reset()
    for _ in range(5):
        venv.step(np.zeros((2, 1), np.float32))
    venv.close()
    lines = str(compare(d, os.path.join(d, "trainer.npz"))).splitlines()
    assert lines[-1] == ("hint: all 2 envs differ in obs from their first events: VecNormalize, between the two "
                         "ledgers, changes observations on purpose; if that change is all there is, %s; what "
                         "VecNormalize then does is %s" % (PLACE, NOT_CHECKED))


# ---------------------------------------------------------------- wrappers not known to change values (issue 24)

class Float16Obs(gym.vector.VectorObservationWrapper):
    """A user's own wrapper that rounds observations through float16: a real fault, not a known normalizer."""

    def observations(self, observations):
        return observations.astype(np.float16).astype(np.float32)


class Float16Plain(gym.vector.VectorWrapper):
    """The same fault in a plain VectorWrapper."""

    def reset(self, **kw):
        obs, info = self.env.reset(**kw)
        return obs.astype(np.float16).astype(np.float32), info

    def step(self, actions):
        obs, *rest = self.env.step(actions)
        return (obs.astype(np.float16).astype(np.float32), *rest)


class DeclaredFloat16(Float16Obs):
    stepledger_changes_values = ("obs",)  # the user says it rounds observations on purpose


def _checked_warning(name, owner="LedgerVectorEnv", outside=False):
    where = "wraps LedgerEnv in the vector env's envs" if outside else "sits between this ledger and the vector env"
    example = ("LedgerEnv(%s(env), directory, index=i)" % name if outside else "%s(%s(envs, path))" % (name, owner))
    return ("%s: %s %s, on the checked side: the values it changes are reported as differences, and those are its "
            "doing; move it %s (e.g. %s) only if its change is intended: what it does is then %s. A wrapper of "
            "yours that changes values on purpose: deliberate_wrappers=[%s] (or stepledger_changes_values = True on "
            "its class); check_wrappers=False silences this" % (owner, name, where, "inside LedgerEnv" if outside
                                                                  else "out", example, NOT_CHECKED, name))


def _checked_hint(name, n, field="obs", outside=False):
    who = "all %d envs differ in %s from their" % (n, field) if n > 1 else "the env differs in %s from its" % field
    return ("hint: %s first events: %s sits between the two ledgers, on the checked side, and the differences are "
            "its doing; move it %s only if its change is intended: what it then does is %s"
            % (who, name, "inside LedgerEnv" if outside else "out of the two ledgers", NOT_CHECKED))


def _ours(caught):
    return [str(w.message) for w in caught if "check_wrappers=False" in str(w.message)]


@pytest.mark.parametrize("wrapper", [Float16Obs, Float16Plain])
def test_a_users_wrapper_is_on_the_checked_side_not_deliberate(tmp_path, wrapper):
    # the case: a VectorObservationWrapper of the user's own between AsyncVectorEnv and LedgerVectorEnv
    # was called a wrapper that changes values on purpose, and the advice moved the fault out of sight; the same
    # in a plain VectorWrapper got no warning at all
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d, t = run(str(tmp_path), n=2, steps=5, wrap=wrapper, vector=gym.vector.AsyncVectorEnv)
    assert _ours(caught) == [_checked_warning(wrapper.__name__)]
    assert "changes values on purpose, so" not in _ours(caught)[0]
    lines = str(compare(d, t)).splitlines()
    assert lines[-1] == _checked_hint(wrapper.__name__, 2), lines
    assert "on purpose" not in lines[-1]


def test_one_env_that_differs_from_its_first_events_is_worded_for_one(tmp_path):
    # a one-env run (or one env file given alone) read "the env differs in obs from their first events"
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        d, t = run(str(tmp_path), n=1, steps=5, wrap=Float16Obs)
    lines = str(compare(d, t)).splitlines()
    assert lines[-1] == _checked_hint("Float16Obs", 1), lines


@pytest.mark.parametrize("how", ["keyword", "class name", "class attribute"])
def test_a_wrapper_the_user_declares_is_deliberate(tmp_path, how):
    wrapper = DeclaredFloat16 if how == "class attribute" else Float16Obs
    kw = {"keyword": {"deliberate_wrappers": [Float16Obs]}, "class name": {"deliberate_wrappers": "Float16Obs"},
          "class attribute": {}}[how]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d, t = run(str(tmp_path), n=2, steps=5, wrap=wrapper, trainer_kw=kw)
    name = wrapper.__name__
    assert _ours(caught) == [
        "LedgerVectorEnv: %s sits between this ledger and the vector env and changes values on purpose, so the envs "
        "will differ from their first events; %s (e.g. %s(LedgerVectorEnv(envs, path))): what it then does, outside "
        "the ledgers, is %s; or pass check_wrappers=False if you mean to check through it"
        % (name, PLACE, name, NOT_CHECKED)]
    lines = str(compare(d, t)).splitlines()
    assert lines[-1] == ("hint: all 2 envs differ in obs from their first events: %s, between the two ledgers, "
                         "changes observations on purpose; if that change is all there is, %s; what %s then does is "
                         "%s" % (name, PLACE, name, NOT_CHECKED))


def test_deliberate_wrappers_refuses_what_is_not_a_class(tmp_path):
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1")])
    with pytest.raises(ValueError) as err:
        LedgerVectorEnv(envs, str(tmp_path / "t.npz"), deliberate_wrappers=[3])
    assert str(err.value) == "LedgerVectorEnv: deliberate_wrappers must be wrapper classes or class names, got 3"
    envs.close()


def test_a_deliberate_wrapper_of_another_field_is_not_blamed(tmp_path):
    # NormalizeReward changes rewards on purpose; the observations that differ are Float16Obs's doing
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d, t = run(str(tmp_path), n=2, steps=5, wrap=lambda e: gym.wrappers.vector.NormalizeReward(Float16Obs(e)))
    assert len(_ours(caught)) == 2
    lines = str(compare(d, t)).splitlines()
    assert lines[-1] == _checked_hint("Float16Obs", 2), lines


class RoundingWrapper(gym.Wrapper):
    """A user's single-env wrapper outside LedgerEnv, rounding observations through float16."""

    def reset(self, **kw):
        obs, info = self.env.reset(**kw)
        return obs.astype(np.float16).astype(np.float32), info

    def step(self, action):
        obs, *rest = self.env.step(action)
        return (obs.astype(np.float16).astype(np.float32), *rest)


def test_a_users_wrapper_around_ledgerenv_is_on_the_checked_side(tmp_path):
    def make(i):
        return RoundingWrapper(LedgerEnv(gym.make("Pendulum-v1"), str(tmp_path), index=i))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([functools.partial(make, i) for i in range(2)]),
                               str(tmp_path / "trainer.npz"))
    assert _ours(caught) == [_checked_warning("RoundingWrapper", outside=True)]
    envs.reset(seed=0)
    envs.step(np.zeros((2, 1), np.float32))
    envs.close()
    lines = str(compare(str(tmp_path), str(tmp_path / "trainer.npz"))).splitlines()
    assert lines[-1] == _checked_hint("RoundingWrapper", 2, outside=True), lines


def test_wrappers_that_only_watch_get_no_warning(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(str(tmp_path), n=2, steps=2, wrap=gym.wrappers.vector.RecordEpisodeStatistics)
    assert _ours(caught) == []


def test_a_hint_without_named_wrappers_says_what_a_move_stops_checking(tmp_path):
    # in AsyncVectorEnv's workers, a wrapper around LedgerEnv is out of the trainer side's sight: the hint
    # names no wrapper, calls none deliberate, and says what moving one out would stop checking
    def make(i):
        return RoundingWrapper(LedgerEnv(gym.make("Pendulum-v1"), str(tmp_path), index=i))
    envs = LedgerVectorEnv(gym.vector.AsyncVectorEnv([functools.partial(make, i) for i in range(2)]),
                           str(tmp_path / "trainer.npz"))
    envs.reset(seed=0)
    envs.step(np.zeros((2, 1), np.float32))
    envs.close()
    lines = str(compare(str(tmp_path), str(tmp_path / "trainer.npz"))).splitlines()
    assert lines[-1] == (
        "hint: all 2 envs differ in obs from their first events: something between the two ledgers changes "
        "observations from the first events on: a wrapper that changes them on purpose (NormalizeObservation, "
        "TransformObservation, FrameStackObservation, VecNormalize, VecFrameStack, VecTransposeImage, ...) does "
        "that, and so does a fault in anything else between them; only if the change is intended, move that "
        "wrapper out: %s; what it then does is %s" % (PLACE, NOT_CHECKED)), lines


def test_the_known_wrappers_cover_gymnasiums_wrappers():
    # every wrapper class Gymnasium exports (single-env and vector) is in the one table, as changing values on
    # purpose or as only watching; a Gymnasium release that adds one makes this fail
    import importlib

    from stepledger.known_wrappers import KNOWN
    missing = []
    for module in ("gymnasium.wrappers", "gymnasium.wrappers.vector"):
        mod = importlib.import_module(module)
        for name in mod.__all__:
            try:
                obj = getattr(mod, name)
            except ImportError:  # the array conversions need jax or torch extras; their names are in the table
                assert name in KNOWN["gymnasium"], name
                continue
            if isinstance(obj, type) and issubclass(obj, (gym.Wrapper, gym.vector.VectorWrapper)):
                if name not in KNOWN["gymnasium"]:
                    missing.append("%s.%s" % (module, name))
    assert missing == []


def test_sb3_vecnormalize_is_deliberate_and_a_users_vecenvwrapper_is_checked(tmp_path):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv, VecEnvWrapper, VecNormalize

    from stepledger.sb3 import LedgerVecEnv

    class Float16VecEnv(VecEnvWrapper):
        def reset(self):
            return self.venv.reset().astype(np.float16).astype(np.float32)

        def step_wait(self):
            obs, *rest = self.venv.step_wait()
            return (obs.astype(np.float16).astype(np.float32), *rest)

    for wrap, name, deliberate in ((VecNormalize, "VecNormalize", True), (Float16VecEnv, "Float16VecEnv", False)):
        d = str(tmp_path / name)
        venv = wrap(DummyVecEnv([functools.partial(_env, i, d, i) for i in range(2)]))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            venv = LedgerVecEnv(venv, os.path.join(d, "trainer.npz"))
        venv.reset()
        for _ in range(3):
            venv.step(np.zeros((2, 1), np.float32))
        venv.close()
        lines = str(compare(d, os.path.join(d, "trainer.npz"))).splitlines()
        if deliberate:
            assert _ours(caught)[0].startswith("LedgerVecEnv: VecNormalize sits between this ledger and the vector "
                                               "env and changes values on purpose")
            assert lines[-1].startswith("hint: all 2 envs differ in obs from their first events: VecNormalize, "
                                        "between the two ledgers, changes observations on purpose")
        else:
            assert _ours(caught) == [_checked_warning(name, owner="LedgerVecEnv")]
            assert lines[-1] == _checked_hint(name, 2), lines


# ---------------------------------------------------------------- TimeLimit outside LedgerEnv

def test_time_limit_outside_ledger_env_hint(tmp_path):
    d, t = run(str(tmp_path), outer_limit=7, steps=20)
    lines = str(compare(d, t)).splitlines()
    assert lines[0] == "env 0, episode 0, step 7: truncated differs (env gave False, trainer received True)"
    assert lines[-1] == ("hint: only truncated differs, and the trainer received True where the env gave False: a "
                         "TimeLimit (or another wrapper that ends episodes) outside LedgerEnv does that; put "
                         "LedgerEnv outermost in the worker, after TimeLimit: its episode ends are then the env's, "
                         "and only their way to the trainer is checked")


def test_a_truncation_fault_of_another_kind_gets_no_time_limit_hint(tmp_path):
    d, t = run(str(tmp_path), fault="truncated:as-term", at=0, steps=15)
    lines = compare(d, t).lines()
    assert not [line for line in lines if line.startswith("hint: only truncated differs")], lines
    # a truncation sent on as a termination is named for what it is
    assert lines[-1].startswith("hint: truncation arrived as termination: "), lines


# ---------------------------------------------------------------- --all: where the differences fall

def test_all_final_obs_at_every_episode_end(tmp_path, capsys):
    d, t = run(str(tmp_path), n=2, fault="final-obs:zero", dose="all", at=0, steps=60)
    assert main(["compare", d, t, "--all"]) == 1
    lines = capsys.readouterr().out.splitlines()
    # 60 vector steps, NEXT_STEP: episodes of 10 steps and a reset step in between end 5 times per env
    assert "env 0: obs differs at the last step of 5 of 5 episodes (final observations: an autoreset " \
           "convention?)" in lines, lines


def test_all_reward_at_every_step(tmp_path):
    d, t = run(str(tmp_path), n=2, fault="reward:f16", dose="all", at=0, steps=30)
    text = str(compare(d, t, count_all=True))
    assert "env 1: reward differs at every step from step 1 on" in text.splitlines(), text


def test_all_one_event_only(tmp_path):
    d, t = run(str(tmp_path), n=2, fault="reward:f16", at=4, steps=30)
    report = compare(d, t, count_all=True)
    assert "env 0: reward differs at one event only" in str(report).splitlines()
    assert report.to_dict()["differences"][0]["patterns"] == ["reward differs at one event only"]


# ---------------------------------------------------------------- live: other settings on the two sides

@pytest.mark.parametrize("vector", [
    gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv,
    functools.partial(gym.vector.SyncVectorEnv, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)],
    ids=["sync", "async", "sync-same-step"])
def test_live_other_reward_dtype_is_refused_at_the_first_token(vector):
    with pytest.raises(SettingsError) as err:
        run(None, n=2, live=True, reward_dtype=np.float64, vector=vector)
    assert str(err.value) == ("LedgerVectorEnv: env 0's LedgerEnv(live=True) records with other settings than this "
                              "ledger: the two sides recorded different reward dtypes: env \"float64\", trainer "
                              "\"float32\"; pass the same reward_dtype to both sides")


def test_live_other_observation_space_is_refused_at_the_first_token():
    wrap = functools.partial(gym.wrappers.vector.DtypeObservation, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(SettingsError, match="the two sides recorded different observation spaces: env .*float32"
                                                ".*, trainer .*float64"):
            run(None, n=2, live=True, wrap=wrap)


def test_live_keep_values_on_one_side_still_checks(tmp_path):
    # keep_values does not change digests: a run with it on one side only is checked, not refused
    d, t = run(str(tmp_path), n=2, live=True, keep_values=True, steps=12)
    assert compare(d, t)


def test_live_sb3_other_reward_dtype_is_refused_at_reset(tmp_path):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv

    from stepledger.sb3 import LedgerVecEnv
    venv = LedgerVecEnv(DummyVecEnv([functools.partial(_env, i, None, i, live=True, reward_dtype=np.float64)
                                     for i in range(2)]), None, live=True)
    with pytest.raises(SettingsError, match="^LedgerVecEnv: env 0's LedgerEnv\\(live=True\\) records with other "
                                            "settings than this ledger: the two sides recorded different reward "
                                            "dtypes"):
        venv.reset()
    venv.close()


def test_offline_settings_refusal_words_the_same(tmp_path):
    d, t = run(str(tmp_path), n=1, steps=3, reward_dtype=np.float64)
    # the trainer side recorded float32, the env side float64
    with pytest.raises(SettingsError) as err:
        compare(d, t)
    assert str(err.value) == ("the two sides recorded different reward dtypes: env \"float64\", trainer \"float32\"; "
                              "pass the same reward_dtype to both sides")


def test_duplicate_index_warns_and_replaces_nothing(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(str(tmp_path), indices=[0, 1, 1], steps=3)
    beside = [str(w.message) for w in caught if "by another ledger (process" in str(w.message)]
    assert len(beside) == 1 and str(tmp_path / "env-1.npz") in beside[0] and "env-1.dup-" in beside[0]
    assert not [w for w in caught if "written by another LedgerEnv" in str(w.message)]  # nothing replaced


def test_no_overwrite_warning_for_flush_then_close_or_a_rerun(tmp_path):
    d = str(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # a second run into the same directory replaces the first run's files: no warning
            env = LedgerEnv(gym.make("Pendulum-v1"), d, index=0)
            env.reset(seed=0)
            env.step(np.zeros(1, np.float32))
            env.flush()
            env.step(np.zeros(1, np.float32))
            env.close()
    assert not [w for w in caught if "written by another LedgerEnv" in str(w.message)]


def test_the_value_changing_wrappers_are_listed_once():
    # one table (stepledger/known_wrappers.py): no other module holds a wrapper's name as a string of its own
    # (a list entry), and the examples the hints name are the table's, for the field they name
    import ast
    import pathlib

    import stepledger
    from stepledger import wording
    from stepledger.known_wrappers import KNOWN
    names = {n for table in KNOWN.values() for n in table}
    package = pathlib.Path(stepledger.__file__).parent
    listed = []
    for path in package.rglob("*.py"):
        if path.name == "known_wrappers.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                listed.append("%s: %r" % (path.name, node.value))
    assert listed == []
    for field, text in wording.WRAPPERS_BY_FIELD.items():
        for name in text.replace(", ...", "").split(", "):
            assert field in (KNOWN["gymnasium"].get(name) or KNOWN["stable_baselines3"][name]), (field, name)
