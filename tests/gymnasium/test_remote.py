"""Environments on another machine: examples/remote_env.py across two network namespaces, and
across library versions (the env side on Gymnasium 1.0, the oldest NumPy it takes and the
pure-Python core; the trainer side here, with the compiled core)."""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import types
import uuid
import warnings

import gymnasium as gym
import numpy as np
import pytest

import stepledger
from side_venv import cached_venv, imported_version
from stepledger import compare

ROOT = testpaths.ROOT
EXAMPLE = os.path.join(ROOT, "examples", "remote_env.py")
STEPS = 100  # vector steps: env 1 reaches the fault (episode 1, step 12) at step 63
NUM_ENVS = 4

OLDEST_VENV = "/tmp/stepledger-oldest-venv"
OLDEST_GYMNASIUM = "1.0.0"
# Gymnasium 1.0 takes numpy>=1.21; the oldest NumPy with CPython 3.11 wheels is 1.23.x.
NUMPY_CANDIDATES = ("1.23.5", "1.24.4", "1.25.2", "1.26.4")

FAULT_LINE = re.compile(r"fault: env (\d+), episode (\d+), step (\d+): reward sent as (\S+) instead of (\S+)")


def _load_example():
    spec = importlib.util.spec_from_file_location("remote_env", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env(extra=None):
    """This process's environment without STEPLEDGER_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env.update(extra or {})
    return env


# ---------------------------------------------------------------- running the two commands

class Server:
    """``remote_env.py --serve`` in a child process; its output is collected by a thread."""

    def __init__(self, args, env, cwd):
        self.proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self):
        return "\n".join(self.lines)

    def port(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = re.match(r"serving .* on (\S+):(\d+), env ledgers", line)
                if m:
                    return int(m.group(2))
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise AssertionError("the env server did not start:\n" + self.output)

    def wait(self, timeout=60):
        try:
            self.proc.wait(timeout)
        finally:
            self.kill()
        self._reader.join(5)
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_bridge(tmp_path, name, fault=False, server_python=sys.executable, server_env=None, server_prefix=(),
               client_python=sys.executable, client_env=None, client_prefix=(), bind="127.0.0.1", connect="127.0.0.1"):
    """Run the server and then the trainer; return (server output, trainer output, env dir, trainer file)."""
    env_dir = str(tmp_path / name / "host-a" / "env-ledgers")
    trainer_file = str(tmp_path / name / "host-b" / "trainer.npz")
    os.makedirs(os.path.dirname(trainer_file))
    serve = list(server_prefix) + [server_python, EXAMPLE, "--serve", "%s:0" % bind, "--dir", env_dir,
                                   "--num-envs", str(NUM_ENVS)] + (["--fault"] if fault else [])
    server = Server(serve, _env(server_env), cwd=str(tmp_path))
    try:
        port = server.port()
        trainer = subprocess.run(list(client_prefix) + [client_python, EXAMPLE, "--connect", "%s:%d" % (connect, port),
                                                        "--trainer-file", trainer_file, "--steps", str(STEPS)],
                                 env=_env(client_env), cwd=str(tmp_path), capture_output=True, text=True, timeout=90)
        assert trainer.returncode == 0, "trainer failed:\n%s\nserver:\n%s" % (trainer.stderr[-3000:], server.output)
        assert server.wait() == 0, "server failed:\n" + server.output
    finally:
        server.kill()
    assert sorted(os.listdir(env_dir)) == ["env-%d.npz" % i for i in range(NUM_ENVS)], server.output
    return server.output, trainer.stdout, env_dir, trainer_file


def check_clean(env_dir, trainer_file):
    report = compare(env_dir, trainer_file)
    assert report.ok, str(report)
    assert str(report).splitlines()[-1] == "0 of %d envs differ" % NUM_ENVS
    cli = subprocess.run([sys.executable, "-m", "stepledger", "compare", env_dir, trainer_file], env=_env(),
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stdout + cli.stderr


def check_fault_caught(server_output, env_dir, trainer_file):
    m = FAULT_LINE.search(server_output)
    assert m, "the server injected no fault:\n" + server_output
    env, episode, step = (int(g) for g in m.groups()[:3])
    assert (env, episode, step) == (1, 1, 12)  # where the README says the example's fault is
    sent, true = float(m.group(4)), float(m.group(5))
    assert np.float32(sent) != np.float32(true), "the fault changed nothing a float32 ledger can see"
    report = compare(env_dir, trainer_file)
    assert not report.ok
    assert len(report.differences) == 1, str(report)
    d = report.differences[0]
    assert (d.env, d.episode, d.step, d.fields) == (env, episode, step, ("reward",)), str(report)
    assert str(report).splitlines()[0].startswith(
        "env %d, episode %d, step %d: reward differs (env gave " % (env, episode, step)), str(report)
    cli = subprocess.run([sys.executable, "-m", "stepledger", "compare", env_dir, trainer_file], env=_env(),
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1, cli.stdout + cli.stderr


# ---------------------------------------------------------------- two hosts: network namespaces

def _ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture(scope="module")
def two_hosts():
    """Two network namespaces joined by a veth pair, or, where they cannot be made, loopback.

    Yields (server_prefix, client_prefix, server_ip, client_ip, description).
    """
    tag = uuid.uuid4().hex[:6]
    ns_a, ns_b = "sl-a-" + tag, "sl-b-" + tag
    veth_a, veth_b = "sla" + tag, "slb" + tag  # interface names: at most 15 characters
    ip_a, ip_b = "10.213.47.1", "10.213.47.2"
    made = []
    try:
        reason = None
        if os.geteuid() != 0:
            reason = "not root"
        elif shutil.which("ip") is None:
            reason = "no ip command (install iproute2)"
        else:
            try:
                for ns in (ns_a, ns_b):
                    _ip("netns", "add", ns)
                    made.append(ns)
                _ip("link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
                for ns, veth, addr in ((ns_a, veth_a, ip_a), (ns_b, veth_b, ip_b)):
                    _ip("link", "set", veth, "netns", ns)
                    _ip("-n", ns, "addr", "add", addr + "/24", "dev", veth)
                    _ip("-n", ns, "link", "set", veth, "up")
                    _ip("-n", ns, "link", "set", "lo", "up")
            except (subprocess.CalledProcessError, OSError) as exc:
                detail = getattr(exc, "stderr", None) or str(exc)
                reason = "cannot make network namespaces (%s)" % detail.strip()
                _remove(made, veth_a)
                made = []
        if reason is None:
            description = ("two hosts: server in network namespace %s (%s), trainer in %s (%s), joined by a veth pair"
                           % (ns_a, ip_a, ns_b, ip_b))
            print(description)
            yield (["ip", "netns", "exec", ns_a], ["ip", "netns", "exec", ns_b], ip_a, ip_b, description)
        else:
            description = ("FALLBACK to loopback: server and trainer are two plain processes on 127.0.0.1, "
                           "because %s" % reason)
            print(description)
            warnings.warn(description, UserWarning)
            yield ([], [], "127.0.0.1", "127.0.0.1", description)
    finally:
        _remove(made, veth_a)


def _remove(namespaces, veth):
    for ns in namespaces:
        _ip("netns", "del", ns, check=False)  # deleting a namespace deletes the veth pair in it
    if shutil.which("ip"):
        _ip("link", "del", veth, check=False)  # in case it was made but never moved


@pytest.mark.parametrize("fault", [False, True], ids=["clean", "fault"])
def test_two_hosts(tmp_path, two_hosts, fault, record_property):
    server_prefix, client_prefix, server_ip, client_ip, description = two_hosts
    record_property("hosts", description)
    server_out, trainer_out, env_dir, trainer_file = run_bridge(
        tmp_path, "run", fault=fault, server_prefix=server_prefix, client_prefix=client_prefix, bind=server_ip,
        connect=server_ip)
    assert "on %s:" % server_ip in server_out
    assert "connected to %s:" % server_ip in trainer_out
    if fault:
        check_fault_caught(server_out, env_dir, trainer_file)
    else:
        assert "fault:" not in server_out
        check_clean(env_dir, trainer_file)


# ---------------------------------------------------------------- mixed versions on the two sides

@pytest.fixture(scope="session")
def oldest_venv():
    """A venv with gymnasium 1.0.0 and the oldest NumPy that installs, cached in /tmp/stepledger-oldest-venv.

    stepledger is not installed there: it runs from this checkout through PYTHONPATH with
    STEPLEDGER_PUREPYTHON=1, so nothing is compiled for the old NumPy.
    """
    alternatives = tuple(["--retries", "1", "--timeout", "20", "gymnasium==" + OLDEST_GYMNASIUM, "numpy==" + v]
                         for v in NUMPY_CANDIDATES)
    python = cached_venv(OLDEST_VENV, "stepledger-versions-ready", "gymnasium %s and an old NumPy" % OLDEST_GYMNASIUM,
                         [alternatives], lambda py: imported_version(py, "gymnasium", "gymnasium"), OLDEST_GYMNASIUM)
    probe = subprocess.run([python, "-c", "import json, numpy, gymnasium; print(json.dumps("
                            "{'numpy': numpy.__version__, 'gymnasium': gymnasium.__version__}))"],
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    return python, json.loads(probe.stdout)


@pytest.mark.parametrize("fault", [False, True], ids=["clean", "fault"])
def test_mixed_versions(tmp_path, oldest_venv, fault, record_property):
    python, versions = oldest_venv
    if stepledger.CORE != "cython":
        pytest.skip("the compiled core is not built in this venv (stepledger.CORE == %r); the trainer side of "
                    "this test needs it" % stepledger.CORE)
    record_property("env_side", "numpy %(numpy)s, gymnasium %(gymnasium)s, pure-Python core" % versions)
    server_out, trainer_out, env_dir, trainer_file = run_bridge(
        tmp_path, "run", fault=fault, server_python=python,
        server_env={"STEPLEDGER_PUREPYTHON": "1", "PYTHONPATH": ROOT})
    # Each side says which versions and which core it ran.
    assert "(stepledger python core, numpy %s, gymnasium %s)" % (versions["numpy"], versions["gymnasium"]) \
        in server_out, server_out
    assert versions["gymnasium"] == OLDEST_GYMNASIUM and versions["numpy"].startswith("1.")
    assert "(stepledger cython core, numpy %s, gymnasium %s)" % (np.__version__, gym.__version__) in trainer_out
    if fault:
        check_fault_caught(server_out, env_dir, trainer_file)
    else:
        check_clean(env_dir, trainer_file)


def test_mixed_versions_the_other_way(tmp_path, oldest_venv):
    """The trainer side on the oldest versions and the pure-Python core, the env side here."""
    python, versions = oldest_venv
    server_out, trainer_out, env_dir, trainer_file = run_bridge(
        tmp_path, "run", fault=True, client_python=python,
        client_env={"STEPLEDGER_PUREPYTHON": "1", "PYTHONPATH": ROOT})
    assert "(stepledger python core, numpy %s, gymnasium %s)" % (versions["numpy"], versions["gymnasium"]) \
        in trainer_out, trainer_out
    check_fault_caught(server_out, env_dir, trainer_file)


# ---------------------------------------------------------------- the client is Gymnasium's NEXT_STEP

def test_remote_vector_env_matches_sync_vector_env(tmp_path):
    """Stepped with the same seeds and actions, RemoteVectorEnv returns what SyncVectorEnv returns."""
    remote_env = _load_example()
    n, env_id, max_steps = 3, "CartPole-v1", 15  # ends by termination and by truncation
    args = types.SimpleNamespace(serve="127.0.0.1:0", dir=str(tmp_path / "env"), num_envs=n, env_id=env_id,
                                 max_episode_steps=max_steps, fault=False, authkey="test-key")
    ports = []
    listener_init = remote_env.Listener

    def listener(*a, **k):  # learn the port the server picked
        lst = listener_init(*a, **k)
        ports.append(lst.address[1])
        return lst
    remote_env.Listener = listener
    thread = threading.Thread(target=remote_env.serve, args=(args,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not ports and time.monotonic() < deadline:
        time.sleep(0.02)
    remote = remote_env.RemoteVectorEnv(("127.0.0.1", ports[0]), b"test-key")
    local = gym.vector.SyncVectorEnv([lambda: gym.make(env_id, max_episode_steps=max_steps) for _ in range(n)])
    assert remote.single_observation_space == local.single_observation_space
    assert remote.single_action_space == local.single_action_space
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(remote.reset(seed=5)[0], local.reset(seed=5)[0])
    terminations = truncations = 0
    for t in range(60):
        if t == 40:  # a partial reset
            mask = np.array([True, False, True])
            ra, la = remote.reset(options={"reset_mask": mask.copy()}), local.reset(options={"reset_mask": mask})
            np.testing.assert_array_equal(ra[0], la[0])
        actions = rng.integers(0, 2, n)
        got, want = remote.step(actions), local.step(actions)
        for r, w in zip(got[:4], want[:4]):
            assert r.dtype == w.dtype
            np.testing.assert_array_equal(r, w)
        terminations += int(np.sum(want[2]))
        truncations += int(np.sum(want[3] & ~want[2]))
    assert terminations and truncations  # both kinds of episode end, and the autoresets after them, were checked
    remote.close()
    local.close()
    thread.join(30)
    assert sorted(os.listdir(args.dir)) == ["env-%d.npz" % i for i in range(n)]


def test_help_documents_the_flags():
    proc = subprocess.run([sys.executable, EXAMPLE, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for flag in ("--serve", "--connect", "--dir", "--num-envs", "--trainer-file", "--steps", "--fault", "--authkey"):
        assert flag in proc.stdout
