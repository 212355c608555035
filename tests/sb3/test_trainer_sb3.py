"""The SB3 trainer side, stepledger.sb3.LedgerVecEnv: exact with DummyVecEnv and SubprocVecEnv."""

import functools
import warnings

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnvWrapper, VecNormalize  # noqa: E402

from stepledger import read
from stepledger import core  # noqa: E402
from stepledger.sb3 import LedgerVecEnv  # noqa: E402

from side_venv import hiding  # noqa: E402
from trainer_envs import (SB3_ACTION_NAMES, SB3_SPACE_NAMES, assert_clean, assert_differs, event_at,  # noqa: E402
                          factories, make_ledger_gym, make_scalar_obs_env, run_sb3, streams)

KINDS = ("dummy", "subproc")
LENGTHS = (1, 3, 2, 4, 1)
ENDS = ("term", "trunc", "both", "term", "both")
RESETS = {6: "all", 11: ("seed", 7), 15: ("options", {"unused": 1}), 20: "all"}


@pytest.mark.parametrize("kind", KINDS)
def test_clean_episode_ends_and_resets(tmp_path, kind):
    path = run_sb3(str(tmp_path), kind, n=3, steps=26, lengths=LENGTHS, ends=ENDS, resets=RESETS)
    assert assert_clean(str(tmp_path), path, n_envs=3) > 90
    _, tr = streams(path)
    for c in tr.values():
        assert c["terminated"].any() and c["truncated"].any()
        # an end by both flags at once is recorded as terminated, as on the env side
        assert not (c["terminated"] & c["truncated"]).any()


@pytest.mark.parametrize("act", SB3_ACTION_NAMES)
@pytest.mark.parametrize("obs", SB3_SPACE_NAMES)
def test_clean_spaces_dummy(tmp_path, obs, act):
    path = run_sb3(str(tmp_path), "dummy", n=2, steps=12, obs=obs, act=act, lengths=(1, 3, 4),
                   ends=("term", "trunc", "both"), resets={7: "all"})
    assert_clean(str(tmp_path), path, n_envs=2)


@pytest.mark.parametrize("obs", SB3_SPACE_NAMES)
def test_clean_spaces_subproc(tmp_path, obs):
    act = SB3_ACTION_NAMES[SB3_SPACE_NAMES.index(obs) % len(SB3_ACTION_NAMES)]
    path = run_sb3(str(tmp_path), "subproc", n=2, steps=10, obs=obs, act=act, lengths=(1, 3, 4),
                   ends=("term", "trunc", "both"), resets={6: "all"})
    assert_clean(str(tmp_path), path, n_envs=2)


# Every batch layout SB3's VecEnvs accept: they send env i actions[i].
LAYOUT_CASES = [(act, layout) for act in ("dict", "tuple", "dict_tuple") for layout in ("list", "tuple", "object")]
LAYOUT_CASES += [(act, layout) for act in ("box", "discrete", "multidiscrete") for layout in ("list", "object")]


@pytest.mark.parametrize("live", (False, True), ids=("offline", "live"))
@pytest.mark.parametrize("act,layout", LAYOUT_CASES)
def test_clean_every_action_batch_layout_dummy(tmp_path, act, layout, live):
    # With live=True a false alarm raises BoundaryFault at the first step.
    path = run_sb3(str(tmp_path), "dummy", n=3, steps=9, act=act, action_batch=layout, lengths=(1, 3, 2),
                   ends=("term", "trunc"), resets={5: "all"}, live=live)
    assert assert_clean(str(tmp_path), path, n_envs=3) > 20


@pytest.mark.parametrize("live", (False, True), ids=("offline", "live"))
@pytest.mark.parametrize("act,layout", [("dict", "list"), ("tuple", "object"), ("dict_tuple", "tuple"),
                                        ("discrete", "list")])
def test_clean_every_action_batch_layout_subproc(tmp_path, act, layout, live):
    path = run_sb3(str(tmp_path), "subproc", n=2, steps=8, act=act, action_batch=layout, lengths=(1, 3),
                   ends=("term", "trunc"), live=live)
    assert assert_clean(str(tmp_path), path, n_envs=2) > 10


def test_the_issue_reproduction_dict_actions_in_dummy_vec_env(tmp_path):
    """Two envs with Dict(a=Discrete(3), b=Box(-1, 1, (2,))) actions, one step, a list of dicts."""
    from gymnasium import spaces as gs
    from stepledger import LedgerEnv, compare
    from trainer_envs import ScriptedEnv
    space = gs.Dict(a=gs.Discrete(3), b=gs.Box(-1, 1, (2,)))

    def make(i):
        env = ScriptedEnv(lengths=(5,))
        env.action_space = space
        return LedgerEnv(env, str(tmp_path), index=i, live=True)

    envs = LedgerVecEnv(DummyVecEnv([functools.partial(make, i) for i in range(2)]), str(tmp_path / "t.npz"),
                        live=True)
    envs.reset()
    envs.step([space.sample(), space.sample()])  # a false alarm raises BoundaryFault here
    envs.close()
    report = compare(str(tmp_path), str(tmp_path / "t.npz"))
    assert report.ok, str(report)


class EditAction(VecEnvWrapper):
    """Changes the ``key`` leaf of env ``target``'s action at vector step ``at``, in any batch layout."""

    def __init__(self, venv, at=3, target=1):
        super().__init__(venv)
        self.t, self.at, self.target = 0, at, target

    def reset(self):
        return self.venv.reset()

    def step_async(self, actions):
        self.t += 1
        if self.t == self.at:
            batch = list(actions)
            value = batch[self.target]
            if isinstance(value, dict):
                value = dict(value, move=np.asarray(value["move"]) * 0.5)
            else:  # a tuple action: (Discrete, Box)
                value = (value[0], np.asarray(value[1]) * 0.5)
            batch[self.target] = value
            actions = batch
        self.venv.step_async(actions)

    def step_wait(self):
        return self.venv.step_wait()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("act,layout", [("dict", "list"), ("dict", "object"), ("dict_tuple", "tuple")])
def test_a_changed_leaf_of_one_env_action_is_located(tmp_path, kind, act, layout):
    inner = EditAction if act == "dict" else _EditDictTuple
    path = run_sb3(str(tmp_path), kind, n=3, steps=6, act=act, action_batch=layout, lengths=(10,),
                   inner=inner)
    assert_differs(str(tmp_path), path, {1: (3, ["h_act"])})


class _EditDictTuple(EditAction):
    def step_async(self, actions):
        self.t += 1
        if self.t == self.at:
            batch = list(actions)
            value = dict(batch[self.target])
            value["z"] = (int(value["z"][0]), np.asarray(value["z"][1]) + 0.25)
            batch[self.target] = value
            actions = batch
        self.venv.step_async(actions)


def test_a_changed_dict_action_raises_live_at_its_env(tmp_path):
    from stepledger import BoundaryFault
    with pytest.raises(BoundaryFault) as err:
        run_sb3(str(tmp_path), "dummy", n=3, steps=6, act="dict", lengths=(10,), inner=EditAction, live=True)
    assert (err.value.env, err.value.episode, err.value.step) == (1, 0, 3), str(err.value)
    assert err.value.fields == ("action",)  # exactly the field it changed


@pytest.mark.parametrize("act", ("dict", "tuple"))
def test_keep_values_of_dict_and_tuple_actions(tmp_path, act):
    path = run_sb3(str(tmp_path), "dummy", n=2, steps=8, act=act, lengths=(2, 3), keep_values=True)
    assert_clean(str(tmp_path), path)
    env, tr = read(str(tmp_path)), read(path)
    try:
        for i in (0, 1):
            a, b = env.streams[i].values, tr.streams[i].values
            assert sorted(a) == sorted(b) and any(name.startswith("values_act") for name in a)
            for name in a:
                assert np.array_equal(a[name], b[name]), (i, name)
            acts = [b[name] for name in sorted(b) if name.startswith("values_act")]
            assert all(np.any(v != 0) for v in acts)  # real values, not the zeros of a failed cast
    finally:
        env.close()
        tr.close()


@pytest.mark.parametrize("obs", ("box32", "dict", "tuple"))
@pytest.mark.parametrize("kind", KINDS)
def test_clean_float64_values_for_a_float32_space(tmp_path, kind, obs):
    # DummyVecEnv casts into the space dtype, SubprocVecEnv passes float64 through:
    # both record the value cast to float32, as the env side does.
    path = run_sb3(str(tmp_path), kind, n=2, steps=10, obs=obs, lengths=(2, 3), ends=("term", "trunc"),
                   float64_obs=True)
    assert_clean(str(tmp_path), path, n_envs=2)


@pytest.mark.parametrize("kind", KINDS)
def test_reused_observation_array(tmp_path, kind):
    """Gymnasium issue 1132, in SB3: terminal_observation is the env's own array,
    overwritten by the reset before the trainer sees it. An obs difference at the
    episode's last step."""
    path = run_sb3(str(tmp_path), kind, n=2, steps=8, lengths=(3,), reuse_obs=True)
    last = event_at(str(tmp_path), 0, 0, 3)
    assert last == 3
    assert_differs(str(tmp_path), path, {0: (last, ["h_obs"]), 1: (last, ["h_obs"])})


class DropTerminalObs(VecEnvWrapper):
    """A VecEnv that does not report terminal_observation."""

    def reset(self):
        return self.venv.reset()

    def step_wait(self):
        obs, rewards, dones, infos = self.venv.step_wait()
        infos = [dict(info) for info in infos]
        for info in infos:
            info.pop("terminal_observation", None)
        return obs, rewards, dones, infos


@pytest.mark.parametrize("kind", KINDS)
def test_done_without_terminal_observation(tmp_path, kind):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = run_sb3(str(tmp_path), kind, n=3, steps=8, lengths=(3,), inner=DropTerminalObs)
    ours = [w for w in caught if "terminal_observation" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert_differs(str(tmp_path), path, {i: (3, ["h_obs"]) for i in range(3)})
    _, tr = streams(path)
    for c in tr.values():
        assert c["h_obs"][3] == core.MISSING_DIGEST and c["h_obs"][7] == core.MISSING_DIGEST


def test_dummy_vec_env_rounds_rewards_to_float32(tmp_path):
    """DummyVecEnv keeps rewards in a float32 buffer: with reward_dtype=float64 on both
    sides that rounding crosses the boundary and shows as a reward difference.
    SubprocVecEnv keeps float64 rewards: clean."""
    d = tmp_path / "dummy"
    path = run_sb3(str(d), "dummy", n=2, steps=6, reward_dtype=np.float64)
    assert_differs(str(d), path, {0: (1, ["h_rew"]), 1: (1, ["h_rew"])})
    d = tmp_path / "subproc"
    path = run_sb3(str(d), "subproc", n=2, steps=6, reward_dtype=np.float64)
    assert_clean(str(d), path)


def test_a_scalar_observation_broadcast_by_dummy_vec_env_differs(tmp_path):
    # DummyVecEnv writes the env's scalar obs into its (n, 3) buffer: the trainer
    # receives [1.5, 1.5, 1.5] where the env gave 1.5. (SubprocVecEnv raises instead.)
    envs = LedgerVecEnv(DummyVecEnv([functools.partial(make_scalar_obs_env, str(tmp_path), i) for i in range(2)]),
                        str(tmp_path / "trainer.npz"))
    envs.reset()
    for _ in range(6):
        envs.step(np.array([0, 1]))
    envs.close()
    assert_differs(str(tmp_path), str(tmp_path / "trainer.npz"), {0: (2, ["h_obs"]), 1: (2, ["h_obs"])})


def test_keep_values_clean(tmp_path):
    path = run_sb3(str(tmp_path), "dummy", n=2, steps=10, obs="dict", act="multidiscrete", lengths=(1, 3),
                   resets={5: "all"}, keep_values=True)
    assert_clean(str(tmp_path), path)
    env, tr = read(str(tmp_path)), read(path)
    try:
        for i in (0, 1):
            a, b = env.streams[i].values, tr.streams[i].values
            assert sorted(a) == sorted(b) and len(a) == 4
            for name in a:
                assert np.array_equal(a[name], b[name]), (i, name)
    finally:
        env.close()
        tr.close()


def test_reset_infos_come_from_the_inner_vec_env(tmp_path):
    envs = LedgerVecEnv(DummyVecEnv(factories(str(tmp_path), 2)), str(tmp_path / "t.npz"))
    envs.reset()
    assert [info["episode"] for info in envs.reset_infos] == [0, 0]
    envs.close()


# ---------------------------------------------------------------- real training


class RewardSpy(VecEnvWrapper):
    """Passes everything through and keeps each returned reward array with a copy."""

    def __init__(self, venv):
        super().__init__(venv)
        self.kept = []

    def reset(self):
        return self.venv.reset()

    def step_wait(self):
        obs, rewards, dones, infos = self.venv.step_wait()
        self.kept.append((rewards, rewards.copy()))
        return obs, rewards, dones, infos

    def edited(self):
        return sum(not np.array_equal(a, b) for a, b in self.kept)


def _ppo(tmp_path, env_id, normalize):
    from stable_baselines3 import PPO
    d = str(tmp_path)
    # SubprocVecEnv's default start method (forkserver): workers import the factories afresh.
    venv = SubprocVecEnv([functools.partial(make_ledger_gym, env_id, d, i) for i in range(4)])
    spy = RewardSpy(LedgerVecEnv(venv, str(tmp_path / "trainer.npz")))
    outer = VecNormalize(spy) if normalize else spy
    model = PPO("MlpPolicy", outer, n_steps=128, batch_size=128, n_epochs=1, seed=0, device="cpu",
                policy_kwargs={"net_arch": [16]})
    model.learn(2048)
    outer.close()
    return d, str(tmp_path / "trainer.npz"), spy


def test_ppo_pendulum_time_limits_bootstrapped(tmp_path):
    # PPO adds gamma * V(terminal obs) to the reward array in place at time limits;
    # the ledger recorded the rewards before that, so the two sides still agree.
    d, path, spy = _ppo(tmp_path, "Pendulum-v1", normalize=False)
    assert spy.edited() >= 2  # the in-place edits did happen
    assert assert_clean(d, path, n_envs=4) >= 4 * 512
    _, tr = streams(path)
    assert all(c["truncated"].sum() >= 2 for c in tr.values())


def test_ppo_cartpole_terminations(tmp_path):
    d, path, _ = _ppo(tmp_path, "CartPole-v1", normalize=True)  # VecNormalize outside the ledger
    assert assert_clean(d, path, n_envs=4) >= 4 * 512
    _, tr = streams(path)
    assert all(c["terminated"].sum() >= 2 for c in tr.values())


# ---------------------------------------------------------------- without SB3

_HIDE_SB3 = hiding("stable_baselines3")


def test_import_without_sb3(run_python):
    """Without SB3 the folder imports (the command line reads its descriptor), and its first name says what to
    install."""
    out = run_python(_HIDE_SB3 + """
import stepledger
from stepledger import LedgerEnv, LedgerVectorEnv, read
import stepledger.sb3
from stepledger.sb3.library import LIBRARY
assert "stable_baselines3" not in sys.modules
try:
    from stepledger.sb3 import LedgerVecEnv
except ImportError as exc:
    print("ImportError:", exc)
else:
    print("imported")
""")
    assert "ImportError:" in out and "plugrl-stepledger[sb3]" in out, out
