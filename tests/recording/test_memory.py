"""Bounded memory: 20M events through the core, RSS does not grow with the run's
length, and the final file is assembled without holding the stream in memory."""

import os
import shutil
import time

import numpy as np
import psutil
import pytest
from gymnasium import spaces as gs

from stepledger.format import schema as S
from stepledger import core
from stepledger.format.ledgerfile import LedgerFile
from stepledger.recording import Recording, spill_everything
from stepledger.format.spaces import LeafLayout

N = 20_000_000
SAMPLE_AT = 5_000_000
EPISODE = 200
MB = 1 << 20


class PeakRSS:
    """The peak RSS of this process over a block, as the kernel keeps it (VmHWM, reset to the current RSS at
    the start): no peak falls between two samples, however busy the machine."""

    def __enter__(self):
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets the high-water mark
        except OSError as exc:
            pytest.skip("cannot reset this process's peak RSS (%s)" % exc)
        return self

    def __exit__(self, *exc):
        with open("/proc/self/status") as f:
            self.peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


@pytest.fixture
def memory_limit_8mb():
    old = core.memory_limit()
    core.set_memory_limit(8 * MB)
    yield
    core.set_memory_limit(old)


def test_20m_events_in_bounded_memory(tmp_path, memory_limit_8mb):
    layout = LeafLayout(gs.Box(-1, 1, shape=(3,), dtype=np.float32))
    path = str(tmp_path / "env-0.npz")
    rec = Recording(path, "env", [0], layout, layout, np.float32, False)
    append = rec.buffers[0].append
    proc = psutil.Process()
    rss = {}
    started = time.perf_counter()
    try:
        # digests are stand-ins (the event number), so the file's content can be checked
        for part, (lo, hi) in enumerate(((0, SAMPLE_AT), (SAMPLE_AT, N))):
            for i in range(lo, hi):
                if append(1 if i % EPISODE else 0, i, N - i, 7, i % EPISODE == EPISODE - 1, False):
                    spill_everything()
            rss[hi] = proc.memory_info().rss
        record_time = time.perf_counter() - started
        assert core.memory_in_use() <= 8 * MB + S.BYTES_PER_EVENT
        assert rec.spills >= N * S.BYTES_PER_EVENT // (8 * MB) - 1
        growth = rss[N] - rss[SAMPLE_AT]
        assert growth < 30 * MB, "RSS grew by %.1f MB from 5M to 20M events" % (growth / MB)

        before = proc.memory_info().rss
        with PeakRSS() as peak:
            t0 = time.perf_counter()
            rec.close()
            close_time = time.perf_counter() - t0
        # the stream is 540 MB of event columns and 320 MB of counters: none of it is held at once
        assert peak.peak - before < 150 * MB, "writing took %.0f MB" % ((peak.peak - before) / MB)
        assert not os.path.exists(path + ".spill")

        lf = LedgerFile(path)
        try:
            assert lf.stream_ids == [0] and lf.offsets.tolist() == [0, N]
            kind = lf.source("kind")
            h_obs = lf.source("h_obs")
            h_act = lf.source("h_act")
            step = lf.source("step")
            episode = lf.source("episode")
            for lo in (0, SAMPLE_AT - 3, N // 2 + 11, N - 1000):
                hi = lo + 1000
                idx = np.arange(lo, hi)
                assert kind.read(lo, hi).tolist() == (idx % EPISODE != 0).astype(np.uint8).tolist()
                assert h_obs.read(lo, hi).tolist() == idx.tolist()
                assert h_act.read(lo, hi).tolist() == (N - idx).tolist()
                assert step.read(lo, hi).tolist() == (idx % EPISODE).tolist()
                assert episode.read(lo, hi).tolist() == (idx // EPISODE).tolist()
        finally:
            lf.close()
        print("\n20M events: record %.1f s, RSS growth 5M->20M %.1f MB, close %.2f s, peak during close +%.0f MB, "
              "%.2f bytes/event on disk" % (record_time, growth / MB, close_time, (peak.peak - before) / MB,
                                            os.path.getsize(path) / N))
    finally:
        rec.close()
        shutil.rmtree(str(tmp_path), ignore_errors=True)
