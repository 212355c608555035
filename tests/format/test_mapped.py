"""The mapped part of a ledger read back after its process was killed: whole, and never more than was written.

A real process records CartPole steps (env side) and kills itself with SIGKILL. Its mapped file is then
read as it is, truncated or zeroed at seeded random offsets, and with another boot id given to the reader
(``STEPLEDGER_BOOT_ID``: a machine that rebooted, whose unsynced pages may never have reached the disk).
In every case what is read is the first events of what the process recorded, nothing else; with the file
as the kill left it, all of them.
"""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from stepledger import LedgerError, read
from stepledger.format import schema as S
from stepledger.format.mapped import maps_of, read_map

SCRIPT = r"""
import os, signal, sys
import gymnasium as gym, numpy as np
from stepledger import LedgerEnv
d, steps, interval, flush_at = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
env = LedgerEnv(gym.make("CartPole-v1"), d, index=0, flush_interval=interval)
env.reset(seed=0)
rng = np.random.default_rng(0)
for t in range(steps):
    _, _, te, tr, _ = env.step(int(rng.integers(0, 2)))
    if te or tr:
        env.reset()
    if t + 1 == flush_at:
        env.flush()  # a spill segment: on disk, synced
os.kill(os.getpid(), signal.SIGKILL)
"""


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env.update(extra)
    return env


def killed_run(directory, steps, flush_at=0, **env):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(directory), str(steps), "1000", str(flush_at)],
                          env=_env(**env), capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-3000:]


def columns(path):
    with read(path) as led:
        return {k: np.asarray(v) for k, v in led.streams[0].columns.items()}, dict(led.meta)


@pytest.fixture(scope="module")
def truth(tmp_path_factory):
    """The same run, closed: every event the killed runs recorded."""
    d = tmp_path_factory.mktemp("truth")
    killed_run(d, 700)  # killed, read from its mapped part
    cols, meta = columns(str(d))
    assert meta[S.META_MAPPED] == len(cols["kind"])
    return cols


def is_prefix(got, truth):
    n = len(got["kind"])
    assert n <= len(truth["kind"])
    for name in S.EVENT_COLUMN_NAMES:
        assert np.array_equal(got[name], truth[name][:n]), name
    return n


def test_a_killed_process_leaves_every_event(tmp_path, truth):
    killed_run(tmp_path, 700)
    got, meta = columns(str(tmp_path))
    assert is_prefix(got, truth) == len(truth["kind"])
    steps = int(np.sum(got["kind"] == S.KIND_STEP))
    assert steps == 700  # every step recorded before the kill
    assert meta[S.META_STATE] == S.STATE_OPEN and meta[S.META_MAPPED] == len(got["kind"])


def test_after_a_spill_the_mapped_part_follows_the_segment(tmp_path, truth):
    killed_run(tmp_path, 700, flush_at=300)
    got, meta = columns(str(tmp_path))
    assert is_prefix(got, truth) == len(truth["kind"])
    assert 0 < meta[S.META_MAPPED] < len(got["kind"])


def test_another_boot_id_reads_up_to_the_last_spill(tmp_path, truth, monkeypatch):
    killed_run(tmp_path, 700, flush_at=300)
    monkeypatch.setenv(S.ENV_BOOT_ID, "another-boot")
    got, meta = columns(str(tmp_path))
    n = is_prefix(got, truth)
    assert int(np.sum(got["kind"] == S.KIND_STEP)) == 300  # the spill's, synced; nothing of the mapped part
    assert meta[S.META_REBOOTED] > 0 and S.META_MAPPED not in meta
    assert n < len(truth["kind"])
    from stepledger.report.compare import how_it_ended  # what compare and show say of how it ended
    assert how_it_ended(meta) == ("its machine rebooted since (another boot id): read up to its last spill, which "
                                  "was on disk, leaving out the %s events in its mapped part, as pages that may "
                                  "never have been written" % f"{meta[S.META_REBOOTED]:,}")


def test_another_boot_id_and_no_spill_reads_nothing(tmp_path, monkeypatch):
    killed_run(tmp_path, 50)
    monkeypatch.setenv(S.ENV_BOOT_ID, "another-boot")
    with pytest.raises(LedgerError, match="rebooted"):
        read(str(tmp_path / "env-0.npz"))


# zeroed pages come of a machine crash, and the boot id then differs: zeroing is read with another boot id only
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("damage, boot", [("truncate", "same"), ("truncate", "rebooted"), ("zero", "rebooted")])
def test_a_damaged_mapped_file_never_gives_what_was_not_written(tmp_path_factory, truth, monkeypatch, seed, damage,
                                                                boot):
    base = tmp_path_factory.mktemp("killed")
    killed_run(base, 700, flush_at=200)
    [path] = maps_of(str(base / "env-0.npz"))
    size = os.path.getsize(path)
    rng = np.random.default_rng(seed)
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(int(rng.integers(0, size)))
    else:
        with open(path, "r+b") as f:
            for _ in range(4):
                at = int(rng.integers(0, size))
                f.seek(at)
                f.write(bytes(min(int(rng.integers(1, 1 << 16)), size - at)))
    if boot == "rebooted":
        monkeypatch.setenv(S.ENV_BOOT_ID, "another-boot")
    got, meta = columns(str(base))
    n = is_prefix(got, truth)
    assert int(np.sum(got["kind"] == S.KIND_STEP)) >= 200  # the spill's events, whatever became of the map
    if boot == "rebooted" and read_map(path) is not None:
        assert S.META_MAPPED not in meta
    shutil.rmtree(base)
    assert n >= 200


def test_small_rings_are_spilled_in_the_background_and_lose_nothing(tmp_path):
    """Rings of about 4,000 events (STEPLEDGER_MAPPED_BYTES small) and no periodic spill: a ring half full asks
    for a spill, the spiller thread writes it, the ring is let go of and reused; killed, every event is read.
    On a quiet machine CartPole fills a ring before the spiller thread, waiting its turn for the interpreter
    after each call that releases it, has written the half asked for: the step that finds the ring seven
    eighths full spills itself (hooks.attend). Without that, every event past the first ring was lost here,
    on every run (docs/ENDINGS.md)."""
    killed_run(tmp_path, 6000, **{S.ENV_MAPPED_BYTES: "120000"})
    got, meta = columns(str(tmp_path))
    assert int(np.sum(got["kind"] == S.KIND_STEP)) == 6000
    assert 0 < meta[S.META_MAPPED] <= 4096  # the rest is in segments
    segs = os.listdir(str(tmp_path / "env-0.npz.spill"))
    assert 0 < len(segs) < 40, segs  # a spill a half ring, merged eight at a time: not one an event


KILLED_BEFORE_ITS_FIRST_EVENT = r"""
import os, signal, sys
import gymnasium as gym
from stepledger import LedgerEnv
env = LedgerEnv(gym.make("CartPole-v1"), sys.argv[1], index=1)  # set up, never reset: a worker killed at once
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_recording_killed_before_its_first_event_is_nothing_recorded_said_so_and_cleared_by_the_next(tmp_path):
    """Its mapped part, made when it was set up, holds no event: the directory reads as without it, the
    ledger's own path is refused with one line that says why, and the next recording at that path removes
    the file."""
    d = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", KILLED_BEFORE_ITS_FIRST_EVENT, d], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-3000:]
    [left] = maps_of(os.path.join(d, "env-1.npz"))
    for path in (d, os.path.join(d, "env-1.npz")):
        with pytest.raises(LedgerError) as raised:
            read(path)
        assert str(raised.value) == (
            "%s: nothing was recorded there: its process died before its first event (%s, its mapped part, "
            "holds none; the next recording at this path removes it)" % (os.path.join(d, "env-1.npz"),
                                                                         os.path.basename(left)))
        cli = subprocess.run([sys.executable, "-m", "stepledger", "show", path], env=_env(), capture_output=True,
                             text=True, timeout=120)
        assert cli.returncode == 2 and cli.stderr.strip() == "stepledger: " + str(raised.value), cli.stderr
    killed_run(d, 30)  # env 0, beside it: the directory is env 0's, and env 1 is not among its streams
    with read(d) as led:
        assert sorted(led.streams) == [0]
    from stepledger import LedgerEnv
    import gymnasium as gym
    env = LedgerEnv(gym.make("CartPole-v1"), d, index=1)
    env.reset(seed=0)
    env.step(0)
    env.close()
    assert maps_of(os.path.join(d, "env-1.npz")) == []
    with read(os.path.join(d, "env-1.npz")) as led:
        assert len(led.streams[1]) == 2


KEPT_VALUES_FAULT = r"""
import os, signal, sys
import gymnasium as gym, numpy as np
from stepledger import LedgerEnv, LedgerVectorEnv
from stepledger.gymnasium.faults import FaultyEnv
d, fault_at = sys.argv[1], int(sys.argv[2])
env_side = LedgerEnv(gym.make("CartPole-v1"), d, index=0, keep_values=True, flush_interval=1000)
make = lambda: FaultyEnv(env_side, "obs:f16", index=0, at=fault_at)
envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([make]), os.path.join(d, "trainer.npz"), keep_values=True,
                       flush_interval=1000)
envs.reset(seed=0)
rng = np.random.default_rng(0)
for t in range(300):
    envs.step(rng.integers(0, 2, size=1))
    if t + 1 == 100:
        envs.flush(), env_side.flush()  # both sides: a spill segment, with the kept values of the first 100 steps
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("fault_at", [40, 200])
def test_kept_values_of_a_killed_run_up_to_its_last_spill_and_the_digests_after(tmp_path, fault_at):
    """keep_values=True on both sides and a float16 observation between them, the run killed: the difference is
    found either way; before the last spill compare shows both values, after it (the events of the mapped parts,
    which hold no values) the digests, and says why."""
    d = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", KEPT_VALUES_FAULT, d, str(fault_at)], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-3000:]
    from stepledger import compare
    report = compare(d, os.path.join(d, "trainer.npz"))
    (diff,) = report.differences
    shown = str(report)
    assert tuple(diff.fields) == ("obs",) and diff.env == 0, shown
    if fault_at < 100:  # the values themselves, and the element that differs
        assert set(diff.env_values) == set(diff.trainer_values) == {"obs"} and diff.detail.get("obs"), shown
    else:  # no values to show, and no advice to keep them: they were
        assert not diff.env_values and not diff.trainer_values and not report.values_hint, shown
    assert report.values_hint is False and "hint: record with keep_values" not in shown, shown
    notes = [n for n in report.notes if "from its mapped part" in n]
    assert len(notes) == 2 and all("but not their kept values" in n for n in notes), report.notes
