"""Words that match what happened (docs/ENDINGS.md): a worker's ledger written on SIGTERM is said as the trainer's
process ending its vector env's workers when that is what happened (a Ctrl-C, a script that ended without close()),
and as a SIGTERM only when one came. Real AsyncVectorEnv workers, real signals, the command line's report."""

import os
import signal
import subprocess
import sys
import time

import pytest

import ending_harness as H
from test_runs_that_end_badly import TIMEOUT, _env, _read_line, _wait_gone, run_case

from stepledger import read
from stepledger.format import schema as S

BY_TRAINER = "ended by the trainer's process (pid %d, its parent)"


def compare_text(directory):
    proc = subprocess.run([sys.executable, "-m", "stepledger", "compare", directory,
                           os.path.join(directory, "trainer.npz")], capture_output=True, text=True, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def metas(directory):
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".npz"):
            with read(os.path.join(directory, name)) as led:
                out[name] = dict(led.meta)
    return out


@pytest.mark.parametrize("harness", ["async-fork", "async-forkserver", "async-spawn", "subproc"])
def test_a_script_that_ends_without_close_is_not_called_a_sigterm(tmp_path, harness):
    d = str(tmp_path)
    code, workers, _, stderr = run_case(d, harness, "no-close")
    assert code == 0, stderr[-3000:]
    meta = metas(d)
    trainer = meta["trainer.npz"]
    assert trainer[S.META_STATE] == S.STATE_EXIT
    for name in ("env-0.npz", "env-1.npz"):  # AsyncVectorEnv's __del__ terminated them: they wrote on SIGTERM
        assert meta[name][S.META_STATE] == S.STATE_SIGNAL
        assert meta[name][S.META_PARENT_PID] == trainer[S.META_PID] and meta[name][S.META_PID] in workers
    text = compare_text(d)
    assert "got SIGTERM" not in text, text
    assert (BY_TRAINER % trainer[S.META_PID]) + ", which exited without close()" in text, text
    assert "env-0.npz, env-1.npz ended by the trainer's process" in text
    shown = subprocess.run([sys.executable, "-m", "stepledger", "show", d], capture_output=True, text=True,
                           env=_env()).stdout
    assert "got SIGTERM" not in shown and shown.count("ended by the trainer's process") == 2, shown


def test_ctrl_c_is_not_called_a_sigterm(tmp_path):
    d = str(tmp_path)
    code, _, _, stderr = run_case(d, "async-fork", "ctrl-c")
    meta = metas(d)
    trainer = meta["trainer.npz"]
    assert trainer[S.META_INTERRUPTED_BY] == "KeyboardInterrupt"  # it ended the program, in or out of a step
    text = compare_text(d)
    assert "got SIGTERM" not in text, text
    assert "trainer.npz: written as its process exited without close(), after Ctrl-C" in text, text
    for name in ("env-0.npz", "env-1.npz"):  # each closed after its worker's own Ctrl-C, or ended by the trainer's
        if meta[name][S.META_STATE] == S.STATE_SIGNAL:
            assert (BY_TRAINER % trainer[S.META_PID]) in text and name in text, text
        else:
            assert meta[name][S.META_STATE] in (S.STATE_CLOSED, S.STATE_INTERRUPTED, S.STATE_EXIT), meta[name]


def test_a_sigterm_to_the_trainer_is_called_a_sigterm(tmp_path):
    d = str(tmp_path)
    code, _, _, stderr = run_case(d, "async-fork", "sigterm")
    assert code == -signal.SIGTERM, stderr[-3000:]
    meta = metas(d)
    trainer = meta["trainer.npz"]
    text = compare_text(d)
    assert "trainer.npz: written when its process got SIGTERM" in text, text
    assert ("written when its process got SIGTERM, as the trainer's process (pid %d, its parent) did"
            % trainer[S.META_PID]) in text, text
    assert "ended by the trainer's process" not in text


def test_a_sigterm_to_a_worker_mid_run_is_called_a_sigterm(tmp_path):
    """A worker killed with SIGTERM while the trainer steps: the trainer's next step fails, which the trainer
    ledger records; the worker's ledger is not said to have been ended by the trainer's process."""
    d = str(tmp_path)
    script = "import ending_harness as H; H.main('async-fork', 'wait', %r)" % d
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(), start_new_session=True)
    try:
        workers = [int(p) for p in _read_line(proc, "workers")]
        _read_line(proc, "ready")
        time.sleep(0.5)
        os.kill(workers[-1], signal.SIGTERM)
        proc.wait(TIMEOUT)
        _wait_gone(workers)
    finally:
        H.reap(proc)
    meta = metas(d)
    assert meta["env-1.npz"][S.META_STATE] == S.STATE_SIGNAL
    assert meta["trainer.npz"].get(S.META_INTERRUPTED_BY) not in (None, "KeyboardInterrupt"), meta["trainer.npz"]
    text = compare_text(d)
    assert "env-1.npz written when its process got SIGTERM" in text, text
    assert "env-1.npz ended by the trainer's process" not in text, text


@pytest.mark.parametrize("exc, said", [(KeyboardInterrupt, "after Ctrl-C"),
                                       (RuntimeError, "after an exception (RuntimeError)")])
def test_what_cut_the_run_is_said(tmp_path, run_python, exc, said):
    """An exception out of a recorded step, then an exit without close(): the ledger says which."""
    d = str(tmp_path)
    run_python("import gymnasium as gym, numpy as np\n"
               "from stepledger import LedgerEnv, LedgerVectorEnv\n"
               "class Breaks(gym.Wrapper):\n"
               "    def step(self, a):\n"
               "        raise %s('in step')\n"
               "envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([lambda: LedgerEnv(Breaks(gym.make('CartPole-v1')), "
               "%r, index=0)]), %r)\n"
               "envs.reset(seed=0)\n"
               "try:\n"
               "    envs.step(np.array([0]))\n"
               "except BaseException:\n"
               "    pass\n" % (exc.__name__, d, os.path.join(d, "trainer.npz")))
    meta = metas(d)
    assert meta["trainer.npz"][S.META_INTERRUPTED_BY] == meta["env-0.npz"][S.META_INTERRUPTED_BY] == exc.__name__
    text = compare_text(d)
    assert "trainer.npz: written as its process exited without close(), %s" % said in text, text


def test_an_exception_out_of_the_training_loop_is_said(tmp_path):
    """The training loop raises: the program exits with it, and its process ends the workers after writing the
    trainer ledger."""
    d = str(tmp_path)
    code, _, _, stderr = run_case(d, "async-fork", "exception")
    assert code == 1 and "the training loop failed" in stderr, stderr[-3000:]
    meta = metas(d)
    trainer = meta["trainer.npz"]
    assert trainer[S.META_INTERRUPTED_BY] == "RuntimeError"
    text = compare_text(d)
    assert "trainer.npz: written as its process exited without close(), after an exception (RuntimeError)" in text
    assert "got SIGTERM" not in text, text
    if any(m[S.META_STATE] == S.STATE_SIGNAL for n, m in meta.items() if n.startswith("env-")):
        assert (BY_TRAINER % trainer[S.META_PID]) + ", which exited without close() after an exception (RuntimeError)" \
            in text, text
