"""Ledgers at fsspec URLs: file:// (the local code path), memory:// (the fsspec code path, in-process only,
since the memory filesystem lives in one process), and an object-store-like filesystem for the fsspec path
across processes. Plain paths are the control."""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import functools
import json
import os
import subprocess
import sys
import uuid

import gymnasium as gym
import numpy as np
import pytest

fsspec = pytest.importorskip("fsspec")
from fsspec.implementations.local import LocalFileSystem  # noqa: E402

from side_venv import hiding  # noqa: E402

from stepledger import LedgerEnv, LedgerVectorEnv, compare, read
from stepledger import core
from stepledger.format import storage  # noqa: E402
from stepledger.errors import LedgerError  # noqa: E402
from stepledger.faults import FaultyEnv  # noqa: E402

TESTS_DIR = testpaths.TESTS_DIR
N_ENVS = 3


class ObjFileSystem(LocalFileSystem):
    """A local directory that behaves like an object store where it matters here: ``mv`` is a copy then a
    delete, not a rename. Registered as ``objfile://``; unlike memory://, it is shared between processes."""

    protocol = ("objfile",)
    moves = 0

    def mv(self, path1, path2, **kwargs):
        type(self).moves += 1
        self.cp_file(path1, path2)
        self.rm(path1)


fsspec.register_implementation("objfile", ObjFileSystem, clobber=True)


def _dest(kind, tmp_path):
    """A fresh ledger directory of the given kind: plain path, file:// URL, memory:// URL or objfile:// URL."""
    local = str(tmp_path / "ledgers")
    if kind == "plain":
        return local
    if kind == "file":
        return "file://" + local
    if kind == "objfile":
        return "objfile://" + local
    return "memory://stepledger-test-%s/ledgers" % uuid.uuid4().hex


def _record(directory, steps=40, fault=False, vector="sync", target=1, keep_values=False):
    """Pendulum envs with LedgerEnv (FaultyEnv outside it when ``fault``) in a Sync/AsyncVectorEnv."""
    faulty = []

    def make(i):
        env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=15), directory, index=i, keep_values=keep_values)
        if fault:
            env = FaultyEnv(env, "reward:f16", index=i, at=5, target=target)
            faulty.append(env)
        return env

    fns = [functools.partial(make, i) for i in range(N_ENVS)]
    inner = gym.vector.SyncVectorEnv(fns) if vector == "sync" else gym.vector.AsyncVectorEnv(fns, context="fork")
    # fork, whatever start method the process has (importing torchrl sets spawn): a spawned worker knows no objfile://
    # registration, and AsyncVectorEnv's env made in this process (its spaces) would go to the workers pickled
    trainer = storage.join(directory, "trainer.npz")
    envs = LedgerVectorEnv(inner, trainer, keep_values=keep_values)
    envs.reset(seed=0)
    envs.action_space.seed(0)
    for _ in range(steps):
        envs.step(envs.action_space.sample())
    envs.close()
    first = faulty[target].first if len(faulty) > target else None  # FaultyEnvs in workers are not here
    return trainer, first


def _cli(*args, register_objfile=False):
    code = "import sys\n"
    if register_objfile:
        code += ("import fsspec, test_storage_urls as t\n"
                 "fsspec.register_implementation('objfile', t.ObjFileSystem, clobber=True)\n")
    code += "from stepledger.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    here = os.path.dirname(os.path.abspath(__file__))  # this module's folder: the child imports it
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, here, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code] + list(args), env=env, capture_output=True, text=True,
                          timeout=120)


# ---------------------------------------------------------------- telling paths from URLs


def test_paths_and_urls():
    assert not storage.is_remote("ledger") and not storage.is_remote("/abs/ledger")
    assert not storage.is_remote("C://ledger")  # a Windows drive, not a scheme
    assert not storage.is_remote("./memory://x")
    assert not storage.is_remote("file:///tmp/x")  # file:// is a local path
    for url in ("memory://x", "s3://bucket/run", "simplecache::s3://bucket/run", "gcs://b/k"):
        assert storage.is_remote(url), url
    assert storage.local_path("file:///tmp/x") == "/tmp/x"
    assert storage.local_path("file://localhost/tmp/x") == "/tmp/x"
    assert storage.local_path("file://rel/x") == "rel/x"
    assert storage.local_path("/tmp/x") == "/tmp/x" and storage.local_path("memory://x") == "memory://x"
    assert storage.join("memory://run", "env-0.npz") == "memory://run/env-0.npz"
    assert storage.join("memory://run/", "env-0.npz") == "memory://run/env-0.npz"
    assert storage.join("ledger", "env-0.npz") == os.path.join("ledger", "env-0.npz")


# ---------------------------------------------------------------- record, compare, catch a fault


@pytest.mark.parametrize("kind", ["plain", "file", "memory"])
def test_clean_and_fault(tmp_path, kind):
    d = _dest(kind, tmp_path)
    trainer, _ = _record(d)
    report = compare(d, trainer)
    assert report, str(report)
    assert str(report) == "0 of %d envs differ" % N_ENVS
    if kind == "memory":
        fs = fsspec.filesystem("memory")
        root = d[len("memory://"):]
        names = sorted(os.path.basename(p) for p in fs.ls(root, detail=False))
        assert names == ["env-0.npz", "env-1.npz", "env-2.npz", "trainer.npz"]  # no .tmp-*, no .spill left
    else:
        assert sorted(os.listdir(tmp_path / "ledgers")) == ["env-0.npz", "env-1.npz", "env-2.npz", "trainer.npz"]

    d2 = _dest(kind, tmp_path / "fault")
    trainer2, first = _record(d2, fault=True)
    assert first is not None and first["env"] == 1
    report = compare(d2, trainer2)
    assert not report
    (diff,) = report.differences
    assert (diff.env, diff.episode, diff.step, diff.fields) == (1, first["episode"], first["step"], ("reward",))
    assert str(report).splitlines()[0].startswith("env 1, episode %d, step %d: reward differs (env gave "
                                                  % (first["episode"], first["step"]))
    with read(d2) as ledger:
        assert ledger.path == storage.local_path(d2) and sorted(ledger.streams) == [0, 1, 2] and not ledger.partial


@pytest.mark.parametrize("kind", ["plain", "file"])
def test_command_line(tmp_path, kind):
    # memory:// lives in one process, so the command line (another process) is tested on file:// only.
    d = _dest(kind, tmp_path / "clean")
    trainer, _ = _record(d)
    proc = _cli("compare", d, trainer)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0 of %d envs differ" % N_ENVS

    d = _dest(kind, tmp_path / "fault")
    trainer, first = _record(d, fault=True)
    proc = _cli("compare", "--json", d, trainer)
    assert proc.returncode == 1, proc.stderr
    (diff,) = json.loads(proc.stdout)["differences"]
    assert (diff["env"], diff["episode"], diff["step"], diff["fields"]) == (1, first["episode"], first["step"],
                                                                            ["reward"])
    proc = _cli("show", d)
    assert proc.returncode == 0 and proc.stdout.startswith(storage.local_path(d) + ": a directory of"), proc.stdout + proc.stderr


def test_object_store_across_processes(tmp_path):
    # The fsspec code path with env sides in worker processes (AsyncVectorEnv) and compare in another process,
    # on a store whose move is a copy then a delete.
    ObjFileSystem.moves = 0
    d = _dest("objfile", tmp_path)
    trainer, _ = _record(d, vector="async")
    assert ObjFileSystem.moves >= 1  # the trainer file was moved into place here; the env files in the workers
    assert sorted(os.listdir(tmp_path / "ledgers")) == ["env-0.npz", "env-1.npz", "env-2.npz", "trainer.npz"]
    assert compare(d, trainer)
    proc = _cli("compare", d, trainer, register_objfile=True)
    assert proc.returncode == 0, proc.stderr

    d = _dest("objfile", tmp_path / "fault")
    trainer, _ = _record(d, fault=True, vector="async")  # the fault's record is in the worker: read the report
    proc = _cli("compare", d, trainer, register_objfile=True)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("env 1, episode 0, step 6: reward differs (env gave ")


def test_sb3_trainer_side_at_a_url(tmp_path):
    sb3 = pytest.importorskip("stable_baselines3")
    from stepledger.sb3 import LedgerVecEnv
    d = _dest("memory", tmp_path)

    def make(i):
        # in the worker too: a worker started by spawn or forkserver (the start method another test or library may
        # have set for the process) does not inherit the parent's registry
        fsspec.register_implementation("objfile", ObjFileSystem, clobber=True)
        env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=15), d, index=i)
        return FaultyEnv(env, "reward:f16", index=i, at=5, target=1)

    venv = LedgerVecEnv(sb3.common.vec_env.DummyVecEnv([functools.partial(make, i) for i in range(2)]),
                        d + "/trainer.npz")
    venv.reset()
    for _ in range(30):
        venv.step(np.stack([venv.action_space.sample() for _ in range(2)]))
    venv.close()
    report = compare(d, d + "/trainer.npz")
    assert [(x.env, x.fields) for x in report.differences] == [(1, ("reward",))]


# ---------------------------------------------------------------- spill segments at a URL


@pytest.fixture
def small_memory():
    old = core.memory_limit()
    core.set_memory_limit(2000)
    try:
        yield
    finally:
        core.set_memory_limit(old)


@pytest.mark.parametrize("kind", ["file", "memory", "objfile"])
def test_spill_segments_at_a_url(tmp_path, kind, small_memory):
    d = _dest(kind, tmp_path)
    env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=15), d, index=0, keep_values=True)
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(300):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    spill = storage.join(d, "env-0.npz.spill")
    if kind == "file":
        segs = sorted(os.listdir(storage.local_path(spill)))
    else:
        env._recording.place.wait()  # the segments were staged locally, then uploaded in the background
        segs = storage.listdir(spill)
        assert env._recording.place.stage is not None
    assert len(segs) >= 3 and all(s.startswith("seg-") and s.endswith(".npz") for s in segs), segs
    # a process killed now would leave these segments: they read as a partial ledger, this run's events
    with read(d) as ledger:
        assert ledger.partial and 0 < len(ledger.streams[0]) <= 300 + 21
    n_events = len(env._recording.buffers[0]) + env._recording._spilled_events
    stage = env._recording.place.stage
    env.close()
    assert storage.listdir(spill) == [] if kind != "file" else not os.path.exists(storage.local_path(spill))
    assert stage is None or not os.path.exists(stage)  # the local staging directory is removed
    with read(d) as ledger:
        assert not ledger.partial and len(ledger.streams[0]) == n_events
        assert ledger.streams[0].values["values_obs_0"].shape == (n_events, 3)


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_spilled_run_compares_and_catches_a_fault(tmp_path, kind, small_memory):
    d = _dest(kind, tmp_path)
    trainer, _ = _record(d, steps=120)
    assert compare(d, trainer)
    d = _dest(kind, tmp_path / "fault")
    trainer, first = _record(d, steps=120, fault=True)
    (diff,) = compare(d, trainer).differences
    assert (diff.env, diff.episode, diff.step, diff.fields) == (1, first["episode"], first["step"], ("reward",))


# ---------------------------------------------------------------- errors


def test_missing_url_is_a_one_line_error(tmp_path):
    d = _dest("memory", tmp_path)
    with pytest.raises(LedgerError) as exc:
        compare(d, d + "/trainer.npz")
    assert str(exc.value) == "%s: no such file" % d
    _record(d, steps=5)
    with pytest.raises(LedgerError) as exc:
        compare(d, d + "/nope.npz")
    assert str(exc.value) == "%s/nope.npz: no such file" % d
    with pytest.raises(LedgerError) as exc:
        compare(d + "/trainer.npz", d)
    assert "\n" not in str(exc.value) and str(exc.value).startswith(d)
    proc = _cli("compare", "file://%s/nope" % tmp_path, "file://%s/nope/trainer.npz" % tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no such file" in proc.stderr


def test_damaged_ledger_at_a_url_is_named_by_its_url(tmp_path):
    d = _dest("memory", tmp_path)
    _record(d, steps=5)
    fs = fsspec.filesystem("memory")
    path = d[len("memory://"):] + "/env-1.npz"
    data = bytearray(fs.cat(path))
    fs.pipe(path, bytes(data[: len(data) // 2]))
    report = compare(d, d + "/trainer.npz")  # named and not compared; the other envs are (exit 3 in the CLI)
    assert not report.complete and [name for name, _ in report.unread] == ["env-1.npz"]
    (why,) = [why for _, why in report.unread]
    assert why and "stepledger-read-" not in why  # nothing of the local stage it was read through
    assert any(n.startswith("env-1.npz: ") and "stepledger-read-" not in n for n in report.notes)


def test_unknown_protocol_fails_when_the_wrapper_is_built():
    with pytest.raises(LedgerError) as exc:
        LedgerEnv(gym.make("CartPole-v1"), "nosuchprotocol://bucket/run", index=0)
    assert str(exc.value).startswith("nosuchprotocol://bucket/run/env-0.npz: cannot open this URL (")
    assert "\n" not in str(exc.value)


def test_without_fsspec(run_python, tmp_path):
    # fsspec hidden by an import blocker: a URL says which extra to install, in one line; plain paths and
    # file:// URLs work and never import fsspec.
    out = run_python(hiding("fsspec") + """
import io, contextlib, gymnasium as gym
from stepledger import LedgerEnv, compare
from envs_for_tests import record_cartpole_run
from stepledger.errors import LedgerError
from stepledger.cli import main
try:
    LedgerEnv(gym.make("CartPole-v1"), "memory://run", index=0)
except ImportError as exc:
    print("ENV", isinstance(exc, LedgerError), str(exc))
try:
    compare("s3://bucket/run", "s3://bucket/run/trainer.npz")
except LedgerError as exc:
    print("COMPARE", str(exc))
err = io.StringIO()
with contextlib.redirect_stderr(err):
    code = main(["compare", "memory://run", "memory://run/trainer.npz"])
print("CLI", code, repr(err.getvalue()))
for d in (sys.argv[1], "file://" + sys.argv[1] + "-url"):
    record_cartpole_run(d, 10)
    print("PLAIN", bool(compare(d, d + "/trainer.npz")))
print("IMPORTED", any(m == "fsspec" or m.startswith("fsspec.") for m in sys.modules))
""".replace("sys.argv[1]", repr(str(tmp_path / "plain"))))
    lines = out.splitlines()
    hint = "pip install 'plugrl-stepledger[remote]'"
    assert lines[0] == "ENV True memory://run/env-0.npz: a URL needs fsspec, which is not installed; install the extra: " + hint
    assert lines[1] == "COMPARE s3://bucket/run: a URL needs fsspec, which is not installed; install the extra: " + hint
    assert lines[2] == "CLI 2 %r" % ("stepledger: memory://run: a URL needs fsspec, which is not installed; "
                                     "install the extra: %s\n" % hint)
    assert lines[3:] == ["PLAIN True", "PLAIN True", "IMPORTED False"]


def test_plain_paths_do_not_import_fsspec(run_python, tmp_path):
    out = run_python("""
import sys
from stepledger import compare
from envs_for_tests import record_cartpole_run
d = %r
record_cartpole_run(d, 10)
print(bool(compare(d, d + "/trainer.npz")), "fsspec" in sys.modules)
""" % str(tmp_path))
    assert out.split() == ["True", "False"]
