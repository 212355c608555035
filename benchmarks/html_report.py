"""The HTML report at scale: page size, time to build it, and time for headless Chromium to render it.

    python benchmarks/html_report.py                 # 100, 1,000 and 3,000 streams, 30% of them differing
    python benchmarks/html_report.py --streams 1000  # one size

Each size records N env ledgers of 200 events (CountEnv-like explicit events) and a trainer ledger in which 30%
of the streams differ in their rewards every 7 events from a point on, compares them with ``count_all`` (the
page then has a strip per differing field), and prints: the page's bytes (and per stream), the median time of
``to_html`` over 5 builds, and the median time of Chromium's ``--dump-dom`` over 3 loads (its start included:
the time from the command to the DOM after the page's script ran). No SVG or image: each stream is a few
elements styled inline.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np

from stepledger import compare, core
from stepledger.format import schema as S
from stepledger.format.spaces import LeafLayout
from stepledger.recording.recording import Recording
from stepledger.report.html import to_html

BOX, ACT = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-2, 2, (1,), np.float32)


def _ledger(path, side, streams):
    rec = Recording(path, side, sorted(streams), LeafLayout(BOX), LeafLayout(ACT), np.float32, False)
    for k, s in enumerate(sorted(streams)):
        for kind, ho, ha, r, te, tr in streams[s]:
            rec.buffers[k].append(kind, ho, ha, core.reward_bits(r, True), te, tr)
    return rec


def _events(start, n=199):
    return [(S.KIND_RESET, start, 0, 0.0, False, False)] + [
        (S.KIND_STEP, start + k, 7, -1.0, False, k == n) for k in range(1, n + 1)]


def record(directory, n):
    events = {e: _events(e * 1000) for e in range(n)}
    trainer = {}
    for e, ev in events.items():
        if e % 10 < 3:
            ev = [(k, o, a, 5.0 if j >= 20 + e % 150 and (j - 20 - e % 150) % 7 == 0 else r, te, tr)
                  for j, (k, o, a, r, te, tr) in enumerate(ev)]
        trainer[e] = ev
    rec = _ledger(os.path.join(directory, "trainer.npz"), "trainer", trainer)  # begun first: the same run
    for e, ev in events.items():
        _ledger(os.path.join(directory, "env-%d.npz" % e), "env", {e: ev}).close()
    rec.close()


def render(page, chromium):
    with tempfile.TemporaryDirectory() as profile:
        t0 = time.perf_counter()
        out = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=%s" % profile,
                              "--dump-dom", "file://" + os.path.abspath(page)], capture_output=True, text=True,
                             timeout=300)
        elapsed = time.perf_counter() - t0
    assert out.returncode == 0 and "streams shown" in out.stdout
    return elapsed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, nargs="*", default=[100, 1000, 3000])
    args = p.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    print("| streams | differ | page bytes | bytes/stream | to_html median | Chromium --dump-dom median |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in args.streams:
        with tempfile.TemporaryDirectory() as d:
            record(d, n)
            report = compare(d, os.path.join(d, "trainer.npz"), count_all=True)
            builds = []
            for _ in range(5):
                t0 = time.perf_counter()
                text = to_html(report)
                builds.append(time.perf_counter() - t0)
            page = os.path.join(d, "report.html")
            with open(page, "w", encoding="utf-8") as f:
                f.write(text)
            size = len(text.encode("utf-8"))
            shown = "%.2f s" % statistics.median(render(page, chromium) for _ in range(3)) if chromium else "no chromium"
            print("| %d | %d | %s | %d | %.0f ms | %s |" % (n, len(report.differences), f"{size:,}", size // n,
                                                           1000 * statistics.median(builds), shown))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
