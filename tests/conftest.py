"""Shared fixtures: running Python in a fresh interpreter with chosen settings."""

import os
import subprocess
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# the helper modules beside this file (ending_harness, side_venv, ...) are imported by the tests in tests/<group>/
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)


def _run_python(code, env_vars=None, timeout=120):
    """Run ``code`` in a new interpreter (tests/ importable); return its stdout.

    STEPLEDGER_* variables of this process are dropped unless given again.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env.update(env_vars or {})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, "subprocess failed:\n" + proc.stderr
    return proc.stdout


import atexit
import multiprocessing as _mp
import shutil
import tempfile

# SB3's learn() makes a log folder in the system's temp directory each time (/tmp/SB3-<time>) unless SB3_LOGDIR
# names one: the suite's go in one folder of this process (inherited by the processes it starts), removed at exit.
if "SB3_LOGDIR" not in os.environ:
    os.environ["SB3_LOGDIR"] = tempfile.mkdtemp(prefix="stepledger-tests-sb3-")
    atexit.register(shutil.rmtree, os.environ["SB3_LOGDIR"], True)

_START_METHOD = _mp.get_start_method(allow_none=True)  # the session's, before any test ran (None: the platform's)
_TORCHRL_TESTS = os.path.join(TESTS_DIR, "torchrl")


@pytest.fixture(autouse=True)
def _the_start_method_a_test_meets_is_the_sessions(request):
    """Importing torchrl sets multiprocessing's start method to spawn for the whole process. A test that imported
    it (tests/package's import checks, say) left every later test starting its vector envs' workers by spawn, not
    by the platform's default that users get: another thing tested, and slower (Tianshou's subproc fault matrix
    took 498 s in the suite, 32 s alone). Each test outside tests/torchrl meets the session's start method; each
    in it, once torchrl is imported, the one torchrl's import sets (spawn), as a TorchRL user's process has."""
    want = _START_METHOD
    if str(request.node.path).startswith(_TORCHRL_TESTS):
        want = "spawn" if "torchrl" in sys.modules else _mp.get_start_method(allow_none=True)
    if _mp.get_start_method(allow_none=True) != want:
        _mp.set_start_method(want, force=True)
    yield


@pytest.fixture(autouse=True)
def _no_recording_outlives_its_test():
    """Close the recordings a test left open (one that failed half-way, say), and forget those that cannot
    be closed: an open recording of this process is seen by every later one (the idle spiller tries it, and
    every step that finds a spill due looks at it), so that one failure would make later tests fail too
    (seen in CI: a re-run test that failed left recordings with a 2 ms interval, and a test two files on
    counted their spills as its own)."""
    spiller = sys.modules.get("stepledger.recording.spiller")
    before = set(spiller.OPEN) if spiller is not None else set()
    yield
    spiller = sys.modules.get("stepledger.recording.spiller")
    if spiller is None:
        return
    import warnings
    for key, rec in list(spiller.OPEN.items()):
        if key in before or rec.pid != os.getpid():
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                rec.close()
            except Exception:
                pass
        spiller.OPEN.pop(key, None)


@pytest.fixture(scope="session")
def s3_server():
    """The suite's S3-compatible server on loopback (tests/s3server.py), one for the whole session: started at
    the first test that asks for it. Skips, saying why, where neither SeaweedFS nor moto's server is installed
    (or s3fs is not); installed but not starting is a failure. Each test makes a bucket of its own."""
    import s3server
    server = s3server.started_or_skip()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def workers_used(monkeypatch):
    """compare's size rule (report/parallel.py) lowered to one event, so that small ledgers use worker
    processes; the list of worker counts each start of workers used."""
    from stepledger.report import parallel
    monkeypatch.setattr(parallel, "MIN_EVENTS_A_WORKER", 1)
    calls = []
    real = parallel._in_processes

    def spy(fn, work, count_all, meta, workers, progress):
        calls.append(workers)
        return real(fn, work, count_all, meta, workers, progress)
    monkeypatch.setattr(parallel, "_in_processes", spy)
    return calls


@pytest.fixture
def run_python():
    return _run_python


_CORE_NAMES = ("IMPLEMENTATION", "StreamBuffer", "EventRecorder", "VectorRecorder", "blake2b64", "digest_leaves",
               "digest_rows", "reward_bits", "reward_bits_array", "first_difference", "set_memory_limit",
               "memory_limit", "memory_in_use", "account", "set_memory_in_use", "set_deadline", "deadline", "MISSING_DIGEST", "INVALID_DIGEST")


@pytest.fixture(params=["cython", "python"])
def core_impl(request, monkeypatch):
    """Run a test on the compiled core, then again on the pure-Python one swapped into stepledger.core."""
    from stepledger import _fallback
    from stepledger import core
    if request.param == "python":
        limit = core.memory_limit()
        for name in _CORE_NAMES:
            monkeypatch.setattr(core, name, getattr(_fallback, name))
        _fallback.set_memory_limit(limit)
        _fallback.set_memory_in_use(0)
    elif core.IMPLEMENTATION != "cython":
        pytest.skip("the compiled core is not built")
    return request.param


@pytest.fixture
def small_memory(core_impl):
    """A memory limit of 4 KB for this process, so that recordings spill every ~150 events (on both cores)."""
    from stepledger import core
    old = core.memory_limit()
    core.set_memory_limit(4096)
    yield
    core.set_memory_limit(old)
