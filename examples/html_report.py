"""A report to look at: a run with faults, compared with --all, written as one HTML page.

Sixteen Pendulum-v1 envs run in an AsyncVectorEnv, both sides recording with keep_values=True. Between the
two sides, FaultyEnv plays a faulty bridge on seven of them: one-off faults (a reward and an observation
rounded through float16, a time limit sent as a termination, an action clipped, a spurious termination)
and two that recur (rewards zeroed, stale observations). The page shows where each env's streams part ways
and, as the report was made with --all, where the later differences fall, field by field.

    python examples/html_report.py report.html                  # then open report.html in a browser
    python examples/html_report.py report.html --screenshot docs/report.png   # with headless Chromium

The same page from the command line: stepledger compare DIR DIR/trainer.npz --all --html report.html
"""

import argparse
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import gymnasium as gym
import numpy as np

from stepledger import LedgerEnv, LedgerVectorEnv, compare
from stepledger.faults import FaultyEnv
from stepledger.report.html import write_html

N_ENVS = 16
# env -> (fault, the step counter it may first hit at, dose: once, or the share of the events after)
FAULTS = {1: ("reward:f16", 12, "one"), 3: ("obs:f16", 40, "one"), 4: ("truncated:as-term", 0, "one"),
          6: ("reward:zero", 60, 0.3), 9: ("obs:stale", 20, 0.05), 10: ("action:clip", 0, "one"),
          13: ("terminated:spurious", 30, "one")}


def make_env(index, directory):
    env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=25), directory, index=index, keep_values=True)
    if index in FAULTS:  # outside LedgerEnv: on the way to the trainer
        fault, at, dose = FAULTS[index]
        env = FaultyEnv(env, fault, index=index, at=at, target=index, dose=dose)
    return env


def run(directory, steps=200, seed=0):
    trainer = os.path.join(directory, "trainer.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FaultyEnv around LedgerEnv is named as on the checked side: it is
        envs = LedgerVectorEnv(gym.vector.AsyncVectorEnv([functools.partial(make_env, i, directory)
                                                          for i in range(N_ENVS)]), trainer, keep_values=True)
        envs.single_action_space.seed(seed)
        envs.reset(seed=seed)
        for _ in range(steps):
            envs.step(np.stack([envs.single_action_space.sample() for _ in range(N_ENVS)]))
        envs.close()
    return trainer


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("page", help="the HTML file to write")
    p.add_argument("--screenshot", metavar="PNG", help="also render the page to PNG with headless Chromium")
    args = p.parse_args()
    base = tempfile.mkdtemp(prefix="stepledger-html-")
    directory = os.path.join(base, "ledger")  # the page names it as the command run in base would
    try:
        trainer = run(directory)
        report = compare(directory, trainer, count_all=True)
        write_html(report, args.page, "stepledger compare ledger ledger/trainer.npz --all")
        print(report)
        print("the page: %s" % args.page)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.screenshot:
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium is None:
            sys.exit("no chromium to take the screenshot with (apt-get install chromium)")
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            "--user-data-dir=%s" % profile, "--window-size=1280,1180",
                            "--screenshot=%s" % os.path.abspath(args.screenshot),
                            "file://" + os.path.abspath(args.page)], check=True, capture_output=True, timeout=120)
        print("the screenshot: %s" % args.screenshot)


if __name__ == "__main__":
    main()
