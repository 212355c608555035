"""What the multi-agent ledgers cost per agent step, side by side with the bare pipeline, in one run.

mpe2's simple_spread_v3 (3 agents, 25 steps an episode, so autoresets are in the figure) through
SuperSuit: ``pettingzoo_env_to_vec_env_v1`` + ``concat_vec_envs_v1(..., num_cpus=0)``, in its Gymnasium
form (trainer side ``LedgerSuperSuitVecEnv``) and its SB3 form (trainer side ``stepledger.sb3.LedgerVecEnv``).
For each form: no ledger, ``LedgerParallelEnv`` in each env copy (env side), the trainer side, both, and
both with ``live=True``. Random discrete actions are generated beforehand. Every pipeline is built once and
they take turns in blocks of vector steps; each turn is set against the bare pipeline's turn of the same
form in the same round (paired differences and ratios, medians over the turns), so a busy moment on a
shared machine falls on both sides of a pair.

    python benchmarks/multiagent_overhead.py            # the full run, writes RESULTS.md
    python benchmarks/multiagent_overhead.py --quick    # a smoke run, writes nothing
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import machine, show, take_turns  # noqa: E402

CONFIGS = ("none", "env", "trainer", "both", "live")
FORMS = ("gymnasium", "stable_baselines3")


def pipeline(form, config, copies, directory, flush_interval):
    import supersuit as ss
    from mpe2 import simple_spread_v3

    from stepledger.pettingzoo import LedgerParallelEnv, LedgerSuperSuitVecEnv, index_supersuit_copies
    from stepledger.sb3 import LedgerVecEnv
    live = config == "live"
    par_env = simple_spread_v3.parallel_env(N=3)
    if config in ("env", "both", "live"):
        par_env = LedgerParallelEnv(par_env, directory, live=live, flush_interval=flush_interval)
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(par_env), copies, num_cpus=0, base_class=form)
    if config in ("env", "both", "live"):
        index_supersuit_copies(venv)
    if config in ("trainer", "both", "live"):
        path = os.path.join(directory, "trainer.npz")
        if form == "gymnasium":
            venv = LedgerSuperSuitVecEnv(venv, path, live=live, flush_interval=flush_interval)
        else:
            venv = LedgerVecEnv(venv, path, live=live, flush_interval=flush_interval, on_fault="record")
    return venv


def reset(venv, form):
    if form == "gymnasium":
        venv.reset(seed=0)
    else:
        venv.reset()


def discard(venv, directory):
    """Close without the final write: the ledgers are not the point here."""
    from stepledger.recording import spiller
    for rec in list(spiller.OPEN.values()):
        rec.discard()
    venv.close()
    shutil.rmtree(directory, ignore_errors=True)


def calls_in_run(copies, actions, runs, flush_interval, live=False):
    """Median µs an agent step spent inside each side's own calls, timed one by one in the stepping loop of the
    Gymnasium form with both ledgers: the env side as LedgerParallelEnv.step less the raw env's step inside it
    (per env copy, over its agents), the trainer side as LedgerSuperSuitVecEnv.step less SuperSuit's step."""
    import supersuit as ss
    from mpe2 import simple_spread_v3
    from pettingzoo.utils import BaseParallelWrapper

    from stepledger.pettingzoo import LedgerParallelEnv, LedgerSuperSuitVecEnv

    clock = time.perf_counter_ns

    class Timed(BaseParallelWrapper):
        def __init__(self, env):
            super().__init__(env)
            self.spent = []

        def step(self, actions):
            t0 = clock()
            out = self.env.step(actions)
            self.spent.append(clock() - t0)
            return out

    class TimedVec:
        def __init__(self, venv):
            self.venv, self.spent = venv, []
            self.num_envs, self.observation_space, self.action_space = (venv.num_envs, venv.observation_space,
                                                                        venv.action_space)

        def reset(self, seed=None, options=None):
            return self.venv.reset(seed=seed, options=options)

        def step(self, a):
            t0 = clock()
            out = self.venv.step(a)
            self.spent.append(clock() - t0)
            return out

        def close(self):
            self.venv.close()

    t0 = clock()
    for _ in range(1000):
        clock()
    timer = (clock() - t0) / 1000
    env_side, trainer_side = [], []
    for _ in range(runs):
        d = tempfile.mkdtemp(prefix="stepledger-bench-")
        par_env = Timed(LedgerParallelEnv(Timed(simple_spread_v3.parallel_env(N=3)), d, live=live,
                                          flush_interval=flush_interval))
        inner = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(par_env), copies, num_cpus=0,
                                      base_class="gymnasium")
        timed = TimedVec(inner)
        from stepledger.pettingzoo import index_supersuit_copies
        index_supersuit_copies(inner)
        venv = LedgerSuperSuitVecEnv(timed, os.path.join(d, "trainer.npz"), live=live, flush_interval=flush_interval)
        venv.reset(seed=0)
        outer = []
        for a in actions:
            t0 = clock()
            venv.step(a)
            outer.append(clock() - t0)
        trainer_side += [(o - i - 2 * timer) / (3 * copies) for o, i in zip(outer, timed.spent)]
        for copy in inner.vec_envs:
            led = copy.par_env
            raw = led.env.env
            env_side += [(o - i - timer) / 3 for o, i in zip(led.spent, raw.spent)]
        discard(venv, d)
    return statistics.median(env_side) / 1000, statistics.median(trainer_side) / 1000


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--copies", type=int, default=4, help="env copies (3 agents each: 3x vector slots)")
    p.add_argument("--steps", type=int, default=1500, help="vector steps per run")
    p.add_argument("--runs", type=int, default=3, help="runs; in each, the pipelines take turns")
    p.add_argument("--block", type=int, default=1, help="vector steps per turn")
    p.add_argument("--flush-interval", type=float, default=1.0,
                   help="seconds between periodic spills (stepledger's default is 5; shorter spills more often)")
    p.add_argument("--quick", action="store_true", help="a smoke run: few steps, no RESULTS.md")
    args = p.parse_args()
    if args.quick:
        args.steps, args.runs = 60, 1
    warnings.filterwarnings("ignore", message=".*render_mode.*")
    import mpe2
    import pettingzoo
    import supersuit
    slots = 3 * args.copies
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 5, slots) for _ in range(args.steps)]
    keys = [(f, c) for f in FORMS for c in CONFIGS]
    times = {k: [] for k in keys}
    block = max(1, min(args.block, args.steps))
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    for _ in range(args.runs):
        dirs = {k: tempfile.mkdtemp(prefix="stepledger-bench-") for k in keys}
        venvs = {k: pipeline(k[0], k[1], args.copies, dirs[k], args.flush_interval) for k in keys}
        for k, v in venvs.items():
            reset(v, k[0])
        take_turns({k: venvs[k].step for k in keys}, actions, block, times)
        for k in keys:
            faults = getattr(venvs[k], "live_faults", [])
            if k[1] == "live" and k[0] == "gymnasium" and faults:
                raise SystemExit("the live check found a fault in a clean run: %s" % faults[0])
            discard(venvs[k], dirs[k])
    seconds, load_after = time.perf_counter() - started, os.getloadavg()[0]

    def paired(form, config, base="none"):
        t, b = times[(form, config)], times[(form, base)]
        return (statistics.median(x - y for x, y in zip(t, b)) / slots,
                statistics.median(x / y for x, y in zip(t, b)))

    rows = ["| form | ledgers | µs per vector step (median) | µs per agent step (median) | µs per agent step "
            "added (paired) | vs. none (paired) |",
            "| --- | --- | --- | --- | --- | --- |"]
    figures = {}
    for form in FORMS:
        for config in CONFIGS:
            med = statistics.median(times[(form, config)])
            added, ratio = paired(form, config)
            figures[(form, config)] = (added, ratio)
            rows.append("| %s | %s | %.0f | %.2f | %s | %s |" % (
                "Gymnasium" if form == "gymnasium" else "SB3", config if config != "live" else "both, live=True",
                med, med / slots, "" if config == "none" else "%.2f" % added,
                "1.000x" if config == "none" else "%.3fx" % ratio))
    live_on_top = {form: paired(form, "live", "both")[0] for form in FORMS}
    out = ["## Multi-agent per-agent-step overhead (benchmarks/multiagent_overhead.py)", "",
           "%s; PettingZoo %s, SuperSuit %s, mpe2 %s." % (machine(), pettingzoo.__version__, supersuit.__version__,
                                                        getattr(mpe2, "__version__", "?")), "",
           "mpe2 simple_spread_v3 (N=3, max_cycles=25: an autoreset every 25 steps), %d env copies = %d vector "
           "slots, through SuperSuit's `concat_vec_envs_v1(..., num_cpus=0)` in its Gymnasium form (trainer side "
           "`LedgerSuperSuitVecEnv`) and its SB3 form (`LedgerVecEnv`); random discrete actions generated "
           "beforehand. %d runs of %d vector steps in which the %d pipelines take turns every %d vector step(s), the "
           "order of the turns rotating from round to round (%.0f s in all; the machine's load average %.1f "
           "before, %.1f after). An agent step is one vector slot's step. The added µs and the ratios are medians of each turn "
           "set against the bare turn of the same form in the same round; env side: `env`, trainer side: "
           "`trainer`. Periodic spills every %g s." % (args.copies, slots, args.runs, args.steps, len(keys), block,
                                                      seconds, load_before, load_after, args.flush_interval),
           ""] + rows
    out += ["", "Side by side, µs per agent step added (paired medians): Gymnasium form: env side %.2f, trainer side "
            "%.2f, both %.2f; SB3 form: env side %.2f, trainer side %.2f, both %.2f. Live mode on top of both "
            "ledgers: %.2f (Gymnasium form), %.2f (SB3 form) µs per agent step."
            % (figures[("gymnasium", "env")][0], figures[("gymnasium", "trainer")][0],
               figures[("gymnasium", "both")][0], figures[("stable_baselines3", "env")][0],
               figures[("stable_baselines3", "trainer")][0], figures[("stable_baselines3", "both")][0],
               live_on_top["gymnasium"], live_on_top["stable_baselines3"]),
            "", "In the SB3 form the live check records the truncation-as-termination finding at every time limit "
            "(SuperSuit's SB3 wrapper never sets TimeLimit.truncated), as it should; the run goes on "
            "(on_fault=\"record\")."]
    env_us, trainer_us = calls_in_run(args.copies, actions, args.runs, args.flush_interval)
    env_live, trainer_live = calls_in_run(args.copies, actions, args.runs, args.flush_interval, live=True)
    out += ["", "Inside the run (Gymnasium form, both ledgers): each side's own calls timed with perf_counter_ns "
            "in the stepping loop, the timer's cost taken off, medians over steps, µs per agent step:", "",
            "| | env side (LedgerParallelEnv.step less the raw env's step inside it) | trainer side "
            "(LedgerSuperSuitVecEnv.step less SuperSuit's step inside it) |", "| --- | --- | --- |",
            "| files only | %.2f | %.2f |" % (env_us, trainer_us),
            "| files and live=True | %.2f | %.2f |" % (env_live, trainer_live), "",
            "A busy machine inflates even paired differences of whole turns; calls of a "
            "few µs are rarely interrupted, so these figures stay close to what the ledgers cost. The env side's "
            "figure includes one wrapper's Python frame, and not the autoreset's reset (SuperSuit calls it apart "
            "from the step)."]
    show("multiagent_overhead", "\n".join(out), write=not args.quick)


if __name__ == "__main__":
    main()
