"""The libraries' own tests as a test of ours.

SB3's own VecEnv tests, from the sdist of the installed version, run twice in a
separate pytest: once with the ledgers inserted into every VecEnv and env they
build (LedgerEnv around each env, LedgerVecEnv directly around each VecEnv), once
with plain pass-through wrappers in the same places (tests/upstream_plugin.py).
Every test's outcome must be the same both ways, and every ledger pair of a VecEnv
that was closed must compare clean. Gymnasium's sdist ships no vector-env tests:
the second half checks its vector envs' documented behaviour with the ledgers in.
"""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import functools
import json
import os
import subprocess
import sys
import tarfile

import gymnasium as gym
import numpy as np
import pytest

from stepledger import LedgerEnv, LedgerVectorEnv, compare

HERE = testpaths.TESTS_DIR
ROOT = os.path.dirname(HERE)

# SB3's VecEnv test files; test_vec_monitor.py needs pandas, which this project does not install.
SB3_FILES = ("test_vec_envs.py", "test_vec_check_nan.py", "test_vec_extract_dict_obs.py",
             "test_vec_stacked_obs.py", "test_vec_normalize.py")
# Left out to keep the run to a minute or two: tests that start worker processes with every start
# method, render or record video, and the ones that train models for a while (off-policy, HER, PPO).
SB3_DESELECT = ("not start_method and not seeding and not video and not render and not offpolicy and not her "
                "and not with_ppo")


def _sb3_tests(cache):
    """SB3's tests/ directory from the sdist of the installed version (downloaded once), or skip."""
    sb3 = pytest.importorskip("stable_baselines3")
    version = sb3.__version__
    tests = os.path.join(cache, "stable_baselines3-%s" % version, "tests")
    if os.path.isdir(tests):
        return tests, version
    os.makedirs(cache, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
           "stable-baselines3==%s" % version, "-d", cache]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip("cannot fetch the stable-baselines3 %s sdist: %s" % (version, exc))
    archive = os.path.join(cache, "stable_baselines3-%s.tar.gz" % version)
    if done.returncode != 0 or not os.path.exists(archive):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip("cannot fetch the stable-baselines3 %s sdist (pip download: %s)" % (version, last))
    prefix = "stable_baselines3-%s/tests/" % version
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
        tar.extractall(cache, members=members, filter="data")
    return tests, version


def _run_suite(tests, mode, out):
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, STEPLEDGER_UPSTREAM_MODE=mode, STEPLEDGER_UPSTREAM_OUT=out,
               PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "upstream_plugin", "-p", "no:cacheprovider",
           "-p", "no:randomly", "-k", SB3_DESELECT, "--rootdir", os.path.dirname(tests)]
    cmd += [os.path.join(tests, name) for name in SB3_FILES]
    done = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=900)
    path = os.path.join(out, "outcomes.json")
    assert os.path.exists(path), done.stdout[-3000:] + done.stderr[-3000:]
    with open(path) as f:
        outcomes = json.load(f)
    vecenvs = []
    if os.path.exists(os.path.join(out, "vecenvs.jsonl")):
        with open(os.path.join(out, "vecenvs.jsonl")) as f:
            vecenvs = [json.loads(line) for line in f]
    return outcomes, vecenvs, done.stdout


def _cache_dir():
    """Where downloaded sdists are kept between runs (CI runs pytest without its cache provider)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "stepledger-tests", "sdists")


def test_sb3_own_vec_env_tests_with_the_ledgers_inserted(tmp_path):
    tests, version = _sb3_tests(_cache_dir())
    ledger, built, out = _run_suite(tests, "ledger", str(tmp_path / "ledger"))
    plain, built_plain, _ = _run_suite(tests, "passthrough", str(tmp_path / "passthrough"))

    # 1. Every test's outcome with the ledgers equals its outcome with a pass-through wrapper.
    assert sorted(ledger) == sorted(plain) and len(ledger) >= 50, out[-2000:]
    differ = {k: (ledger[k], plain[k]) for k in ledger if ledger[k] != plain[k]}
    assert not differ, differ
    assert sum(v == "passed" for v in ledger.values()) >= 40
    assert len(built) == len(built_plain) >= 40  # the ledgers were inserted, as often both ways

    # 2. Every ledger pair of a VecEnv that was closed compares clean.
    compared = clean = 0
    unclean = []
    for vec in built:
        d = vec["dir"]
        if not os.path.exists(os.path.join(d, "closed")):
            continue
        trainer = os.path.join(d, "trainer.npz")
        env_files = [n for n in os.listdir(d) if n.startswith("env-") and n.endswith(".npz")]
        if not os.path.exists(trainer) and not env_files:
            continue  # closed before any reset: nothing recorded on either side
        assert os.path.exists(trainer) and len(env_files) == vec["n"], (vec, sorted(os.listdir(d)))
        report = compare(d, trainer)
        compared += 1
        if report.ok:
            clean += 1
        else:
            unclean.append((vec["test"], str(report)))
    assert not unclean, unclean
    assert compared >= 30
    counts = {"sb3": version, "upstream_tests": len(ledger), "passed": sum(v == "passed" for v in ledger.values()),
              "outcomes_equal": len(ledger) - len(differ), "vecenvs_built": len(built),
              "ledger_pairs_compared": compared, "clean": clean}
    print("upstream SB3 suite:", json.dumps(counts, sort_keys=True))
    with open(os.path.join(str(tmp_path), "counts.json"), "w") as f:
        json.dump(counts, f)


# ---------------------------------------------------------------- Gymnasium's documented behaviour
#
# Written from Gymnasium's vector-env documentation (gymnasium.farama.org, "Vector" and "Vector
# Autoreset Mode"); each check runs on a bare vector env and on the same vector env with the
# ledgers inserted, and must hold on both, with the ledgers compared clean at the end.

class Counter(gym.Env):
    """Observation = the step count within the episode; episodes last ``length`` steps."""

    metadata = {"render_modes": []}

    def __init__(self, length=3, offset=0.0):
        self.observation_space = gym.spaces.Box(-100, 100, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.length, self.offset, self.t = length, offset, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.offset], np.float32), {"reset": True}

    def peek(self, plus=0):
        return self.t + plus

    def step(self, action):
        self.t += 1
        obs = np.array([self.offset + self.t], np.float32)
        return obs, float(self.t), self.t >= self.length, False, {"t": self.t}


def _counter(directory, i, ledgers):
    env = Counter(length=2 + i, offset=10.0 * i)
    return LedgerEnv(env, directory, index=i) if ledgers else env


def _venv(kind, mode, directory, ledgers, n=2):
    fns = [functools.partial(_counter, directory, i, ledgers) for i in range(n)]
    mode = gym.vector.AutoresetMode(mode)
    if kind == "sync":
        venv = gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
    else:
        venv = gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode)
    return LedgerVectorEnv(venv, os.path.join(directory, "trainer.npz")) if ledgers else venv


def _documented_next_step(envs):
    """NEXT_STEP: the step after an episode end returns the reset obs, reward 0, no end flags."""
    obs, info = envs.reset(seed=0)
    assert obs[:, 0].tolist() == [0.0, 10.0] and info["reset"].tolist() == [True, True]
    seen = []
    for _ in range(5):
        obs, rew, term, trunc, info = envs.step(np.zeros(2, np.int64))
        seen.append((obs[:, 0].tolist(), rew.tolist(), term.tolist()))
    # env 0 lasts 2 steps: step 2 ends it (obs 2, terminated), step 3 is its reset (obs 0, reward 0)
    assert seen[1][0][0] == 2.0 and seen[1][2][0] is True
    assert seen[2][0][0] == 0.0 and seen[2][1][0] == 0.0 and seen[2][2][0] is False
    assert seen[3][0][0] == 1.0
    # env 1 lasts 3 steps
    assert seen[2][2][1] is True and seen[3][0][1] == 10.0 and seen[3][1][1] == 0.0


def _documented_same_step(envs):
    """SAME_STEP: the ending step returns the reset obs, its own reward and flags, final_obs in info."""
    envs.reset(seed=0)
    envs.step(np.zeros(2, np.int64))
    obs, rew, term, trunc, info = envs.step(np.zeros(2, np.int64))
    assert obs[0, 0] == 0.0 and rew[0] == 2.0 and term[0]
    assert info["_final_obs"].tolist() == [True, False]
    assert info["final_obs"][0].tolist() == [2.0]
    assert info["final_info"]["t"][0] == 2 and info["reset"][0]


def _documented_reset_mask(envs):
    """reset(options={"reset_mask": m}) resets only the masked envs; the others keep their obs."""
    envs.reset(seed=0)
    envs.step(np.zeros(2, np.int64))
    obs, _ = envs.reset(options={"reset_mask": np.array([False, True])})
    assert obs[:, 0].tolist() == [1.0, 10.0]
    obs = envs.step(np.zeros(2, np.int64))[0]
    # env 0's episode ends at this step: SAME_STEP returns its reset obs at once
    same = envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    assert obs[:, 0].tolist() == [0.0 if same else 2.0, 11.0]


def _documented_calls(envs):
    """call, get_attr and set_attr reach every sub-env (returned as tuples)."""
    assert envs.get_attr("length") == (2, 3)
    envs.set_attr("length", [4, 4])
    assert envs.get_attr("length") == (4, 4)
    envs.reset(seed=0)
    envs.step(np.zeros(2, np.int64))
    assert envs.call("peek", plus=10) == (11, 11)


BEHAVIOURS = [("NextStep", _documented_next_step), ("SameStep", _documented_same_step),
              ("NextStep", _documented_reset_mask), ("SameStep", _documented_reset_mask),
              ("NextStep", _documented_calls)]


@pytest.mark.parametrize("kind", ("sync", "async"))
@pytest.mark.parametrize("mode,check", BEHAVIOURS, ids=[f"{m}-{c.__name__[12:]}" for m, c in BEHAVIOURS])
def test_gymnasium_vector_env_documented_behaviour_holds_with_the_ledgers(tmp_path, kind, mode, check):
    for ledgers in (False, True):
        d = str(tmp_path / ("ledgers" if ledgers else "bare"))
        envs = _venv(kind, mode, d, ledgers)
        try:
            check(envs)
        finally:
            envs.close()
    d = str(tmp_path / "ledgers")
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, str(report)
