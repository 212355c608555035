"""compare and the stepledger command: wording, exit codes, refusals, JSON, --all."""

import json
import os
import subprocess
import sys
import zipfile

import gymnasium as gym
import numpy as np
import pytest

import stepledger
from stepledger import LedgerEnv, LedgerError, LedgerVectorEnv, compare
from stepledger.format import schema as S
from stepledger.cli.main import main
from stepledger.faults import FaultyEnv
from stepledger.recording.recording import Recording
from stepledger.format.spaces import LeafLayout

BOX = gym.spaces.Box(-1, 1, (3,), np.float32)
ACT = gym.spaces.Box(-2, 2, (1,), np.float32)


def ledger(path, side, streams, reward_dtype=np.float32, obs_space=BOX, act_space=ACT):
    """Write a ledger from explicit events: streams maps env -> [(kind, h_obs, h_act, reward, te, tr)]."""
    from stepledger import core
    rec = Recording(path, side, sorted(streams), LeafLayout(obs_space), LeafLayout(act_space), reward_dtype, False)
    is_f32 = np.dtype(reward_dtype) == np.float32
    for k, env in enumerate(sorted(streams)):
        for kind, ho, ha, r, te, tr in streams[env]:
            rec.buffers[k].append(kind, ho, ha, core.reward_bits(r, is_f32), te, tr)
    rec.close()
    return path


def episode(n_steps, start=100, reward=-1.0, end=(False, True)):
    events = [(S.KIND_RESET, start, 0, 0.0, False, False)]
    for k in range(1, n_steps + 1):
        last = k == n_steps
        events.append((S.KIND_STEP, start + k, 7, reward, end[0] and last, end[1] and last))
    return events


def two_sides(tmp_path, env_streams, trainer_streams, **kw):
    d = tmp_path / "ledger"
    d.mkdir(exist_ok=True)
    for env, events in env_streams.items():
        ledger(str(d / ("env-%d.npz" % env)), "env", {env: events}, **kw)
    trainer = ledger(str(d / "trainer.npz"), "trainer", trainer_streams, **kw)
    return str(d), trainer


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "stepledger", *args], capture_output=True, text=True)


def test_identical_streams_compare_clean(tmp_path):
    streams = {0: episode(5) + episode(3), 1: episode(4)}
    d, t = two_sides(tmp_path, streams, streams)
    report = compare(d, t)
    assert report and report.ok
    assert str(report) == "0 of 2 envs differ"
    assert main(["compare", d, t]) == 0


def test_reward_line_prints_both_values_with_shortest_digits(tmp_path):
    env = {0: episode(5), 1: episode(20, reward=-11.843963)}
    tr = {0: episode(5), 1: episode(20, reward=-11.843963)}
    tr[1] = tr[1][:13] + [(S.KIND_STEP, 113, 7, -14.121007, False, False)] + tr[1][14:]
    d, t = two_sides(tmp_path, env, tr)
    report = compare(d, t)
    assert not report
    assert str(report).splitlines() == [
        "env 1, episode 0, step 13: reward differs (env gave -11.843963, trainer received -14.121007)",
        "1 of 2 envs differ"]
    diff = report.differences[0]
    assert (diff.env, diff.episode, diff.step, diff.fields) == (1, 0, 13, ("reward",))
    assert main(["compare", d, t]) == 1


def test_several_fields_and_flag_values(tmp_path):
    env = {4: episode(25)}
    tr = {4: episode(25, end=(True, False))}
    d, t = two_sides(tmp_path, env, tr)
    line = str(compare(d, t)).splitlines()[0]
    assert line == ("env 4, episode 0, step 25: terminated, truncated differ (terminated: env gave False, "
                    "trainer received True; truncated: env gave True, trainer received False)")


def test_obs_without_values_says_only_differs_and_hints_once(tmp_path):
    env = {0: episode(5), 3: episode(9) + episode(9)}
    tr = {0: episode(5), 3: episode(9) + episode(9)}
    tr[3][10 + 7] = (S.KIND_STEP, 999, 7, -1.0, False, False)
    tr[0][2] = (S.KIND_STEP, 998, 8, -1.0, False, False)
    d, t = two_sides(tmp_path, env, tr)
    lines = str(compare(d, t)).splitlines()
    assert lines[0] == "env 0, episode 0, step 2: action, obs differ"
    assert lines[1] == "env 3, episode 1, step 7: obs differs"
    assert lines[2] == "2 of 2 envs differ"
    assert lines[3].startswith("hint:") and "keep_values=True" in lines[3]
    assert len(lines) == 4


def test_kind_difference_is_its_own_line(tmp_path):
    env = {3: episode(4) + episode(4)}
    tr = {3: episode(4) + [(S.KIND_STEP, 104, 7, -1.0, False, False)] + episode(3)}
    d, t = two_sides(tmp_path, env, tr)
    assert str(compare(d, t)).splitlines()[0] == "env 3, episode 1, step 0: kind differs (env gave reset, trainer received step)"


def test_streams_of_different_length(tmp_path):
    env = {2: episode(10) + episode(10)}
    tr = {2: episode(10) + episode(10)[:4]}
    d, t = two_sides(tmp_path, env, tr)
    report = compare(d, t)
    line = str(report).splitlines()[0]
    assert line == ("env 2: the trainer stream stops early, after episode 1, step 3 (env side 22 events, trainer "
                    "side 15); the 15 events both sides have agree")
    assert "differs" not in line and report.differences[0].what == "length"
    assert main(["compare", d, t]) == 1


def test_env_on_one_side_only(tmp_path):
    d, t = two_sides(tmp_path, {0: episode(3), 1: episode(3), 5: episode(2)}, {0: episode(3), 1: episode(3), 7: episode(2)})
    lines = str(compare(d, t)).splitlines()
    assert lines == [
        "env 5: recorded only on the env side (3 events); the trainer ledger has no stream for it",
        "env 7: recorded only on the trainer side (3 events); the env ledger has no stream for it",
        "2 of 4 envs differ",
        # the two streams hold the same events: most likely one env was given the wrong index
        "hint: env-5.npz matches the trainer's env 7: is index= each env's position in the vector env?"]


def test_count_all_tells_one_off_from_systematic(tmp_path):
    env = {0: episode(50)}
    once = [list(e) for e in episode(50)]
    once[10][3] = 5.0
    every = [(k, h, a, r + 1.0 if k == S.KIND_STEP else r, te, tr) for k, h, a, r, te, tr in episode(50)]
    d, t = two_sides(tmp_path, env, {0: [tuple(e) for e in once]})
    assert compare(d, t, count_all=True).differences[0].counts["reward"] == 1
    (tmp_path / "b").mkdir()
    d2, t2 = two_sides(tmp_path / "b", env, {0: every})
    report = compare(d2, t2, count_all=True)
    assert report.differences[0].counts["reward"] == 50
    assert "reward 50" in str(report)


def test_json_report(tmp_path, capsys):
    env = {0: episode(5), 1: episode(5)}
    tr = {0: episode(5), 1: episode(5, reward=-2.0)}
    d, t = two_sides(tmp_path, env, tr)
    assert main(["compare", d, t, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["envs"] == [0, 1] and out["n_differ"] == 1
    diff = out["differences"][0]
    assert diff["env"] == 1 and diff["type"] == "fields" and diff["episode"] == 0 and diff["step"] == 1
    assert diff["fields"] == ["reward"] and diff["env_values"]["reward"] == -1.0  # numbers, not strings
    assert diff["trainer_values"]["reward"] == -2.0


@pytest.mark.parametrize("what", ["reward_dtype", "obs_space", "act_space"])
def test_refuses_different_settings(tmp_path, what, capsys):
    d = tmp_path / "ledger"
    d.mkdir()
    ledger(str(d / "env-0.npz"), "env", {0: episode(3)})
    kw = {"reward_dtype": np.float64} if what == "reward_dtype" else (
        {"obs_space": gym.spaces.Box(-1, 1, (6,), np.float32)} if what == "obs_space" else
        {"act_space": gym.spaces.Discrete(3)})
    ledger(str(d / "trainer.npz"), "trainer", {0: episode(3)}, **kw)
    with pytest.raises(LedgerError) as err:
        compare(str(d), str(d / "trainer.npz"))
    assert "\n" not in str(err.value)
    assert main(["compare", str(d), str(d / "trainer.npz")]) == 2
    msg = capsys.readouterr().err
    if what == "obs_space":
        assert "observation space" in msg and "VecFrameStack" in msg and '"shape": [6]' in msg
    if what == "reward_dtype":
        assert "reward dtype" in msg


def test_refusals_exit_2_with_one_line(tmp_path):
    d, t = two_sides(tmp_path, {0: episode(3)}, {0: episode(3)})
    empty = tmp_path / "empty"
    empty.mkdir()
    junk = tmp_path / "junk.npz"
    np.savez(junk, a=np.arange(3))
    cases = [
        ([t, d], "wrong order"),
        ([str(tmp_path / "nope"), t], "no such file"),
        ([str(empty), t], "no env ledgers"),
        ([d, str(tmp_path / "missing.npz")], "no such file"),
        ([d, str(junk)], "not a ledger"),
        ([d, os.path.join(d, "env-0.npz")], "not a trainer-side ledger"),
    ]
    for args, words in cases:
        proc = run_cli("compare", *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert words in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_newer_format_version_is_refused(tmp_path):
    d, t = two_sides(tmp_path, {0: episode(3)}, {0: episode(3)})
    newer = tmp_path / "newer.npz"
    with zipfile.ZipFile(t) as src, zipfile.ZipFile(newer, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "meta.npy":
                meta = json.loads(str(np.load(t)["meta"]))
                meta["format_version"] = S.FORMAT_VERSION + 1
                import io
                buf = io.BytesIO()
                np.save(buf, np.array(json.dumps(meta)))
                data = buf.getvalue()
            dst.writestr(info.filename, data)
    with pytest.raises(LedgerError, match="newer"):
        compare(d, str(newer))


def test_keep_values_prints_values_and_first_element(tmp_path):
    d = str(tmp_path)

    def make(i):
        env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=10), d, index=i, keep_values=True)
        return FaultyEnv(env, "obs:f16", index=i, at=3, target=1) if i == 1 else env

    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([lambda i=i: make(i) for i in range(2)]),
                           os.path.join(d, "trainer.npz"), keep_values=True)
    envs.reset(seed=0)
    envs.single_action_space.seed(0)
    for _ in range(8):
        envs.step(np.stack([envs.single_action_space.sample() for _ in range(2)]))
    envs.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    line = str(report).splitlines()[0]
    assert line.startswith("env 1, episode 0, step 4: obs differs (env gave [")
    assert "trainer received [" in line and ", first at [" in line
    diff = report.differences[0]
    gave = np.array(json.loads(diff.env_values["obs"]), dtype=np.float32)
    got = np.array(json.loads(diff.trainer_values["obs"]), dtype=np.float32)
    assert np.array_equal(gave.astype(np.float16).astype(np.float32), got) and not np.array_equal(gave, got)
    assert "hint" not in str(report)


def test_keep_values_on_one_side_only_still_compares(tmp_path):
    d = str(tmp_path)

    def make(i):
        env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=10), d, index=i, keep_values=True)
        return FaultyEnv(env, "obs:zero", index=i, at=2, target=0)

    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([lambda: make(0)]), os.path.join(d, "trainer.npz"))
    envs.reset(seed=0)
    for _ in range(5):
        envs.step(np.zeros((1, 1), np.float32))
    envs.close()
    lines = str(compare(d, os.path.join(d, "trainer.npz"))).splitlines()
    assert lines[0] == "env 0, episode 0, step 3: obs differs"


def test_show_and_version(tmp_path, capsys):
    d, t = two_sides(tmp_path, {0: episode(5) + episode(2), 1: episode(3)}, {0: episode(5) + episode(2), 1: episode(3)})
    assert main(["show", t]) == 0
    out = capsys.readouterr().out
    assert "trainer side" in out and "env 0: 9 events, 2 episodes started, 7 steps" in out
    assert main(["show", d, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(led["name"], led["events"]) for led in data["ledgers"]] == [("env-0.npz", 9), ("env-1.npz", 4), ("trainer.npz", 13)]
    proc = run_cli("--version")
    assert proc.returncode == 0 and stepledger.__version__ in proc.stdout and stepledger.CORE in proc.stdout


def test_help_has_examples():
    for sub in ("compare", "show", "check", "demo"):
        proc = run_cli(sub, "--help")
        assert proc.returncode == 0 and "example" in proc.stdout, sub


def test_partial_ledger_from_spilled_segments(tmp_path):
    """A process that died after spilling but before writing its file is compared up to its end, and its
    early end is not a difference (issue 12's rule: only two cleanly closed ledgers must end together)."""
    code = r"""
import os, signal, gymnasium as gym, numpy as np
from stepledger import LedgerEnv, core
core.set_memory_limit(27 * 40)
env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=20), %r, index=0)
env.reset(seed=0)
for t in range(130):
    env.step(np.zeros(1, np.float32))
    if t %% 20 == 19: env.reset()
os.kill(os.getpid(), signal.SIGKILL)
""" % str(tmp_path)
    # without a mapped part (STEPLEDGER_MAPPED_BYTES=0, as ledgers at a URL): what is read is what was spilled
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, STEPLEDGER_MAPPED_BYTES="0"))
    assert proc.returncode == -9
    assert not os.path.exists(tmp_path / "env-0.npz") and os.path.isdir(tmp_path / "env-0.npz.spill")
    env_ledger = stepledger.read(str(tmp_path))
    assert env_ledger.partial and 40 <= env_ledger.n_events() < 137
    env_ledger.close()
    # a clean trainer ledger of the same run (recorded in this process)
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1", max_episode_steps=20)]),
                           str(tmp_path / "trainer.npz"), autoreset_mode="next_step")
    envs.reset(seed=0)
    for _ in range(130):
        envs.step(np.zeros((1, 1), np.float32))
    envs.close()
    report = compare(str(tmp_path), str(tmp_path / "trainer.npz"))
    text = str(report)
    # the env ledger was never closed: streams that agree as far as both go are not a difference
    assert report.ok and report.partial["env"]
    assert "env 0: records end at different points (the env side stopped" in text
    assert "env-0.npz not closed (its process is gone)" in text


def test_a_trainer_stream_with_no_events_and_no_env_ledger_is_not_an_env(tmp_path):
    # a trainer ledger sized for more envs than it saw (stepledger.rllib keeps streams for runners RLlib may
    # recreate): the streams that never got an event name no env; an env ledger without events there still does
    from stepledger import TrainerLedger
    d = str(tmp_path)
    env = LedgerEnv(gym.make("CartPole-v1"), d, index=2)
    obs, _ = env.reset(seed=0)
    led = TrainerLedger(os.path.join(d, "trainer.npz"), 6, env.observation_space, env.action_space)
    led.env_reset(2, obs)
    obs, reward, terminated, truncated, _ = env.step(1)
    led.env_steps(2, np.array([1]), obs[None], np.array([reward]), np.array([terminated]), np.array([truncated]))
    env.close()
    led.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok and report.envs == [2], str(report)
    other = LedgerEnv(gym.make("CartPole-v1"), d, index=4)
    other.reset(seed=1)
    other.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert [x.env for x in report.differences] == [4], str(report)
