"""What stepledger.rllib costs an RLlib run, side by side with no ledger, in one Ray session.

Two PPO algorithms of the same config are built at once, one plain and one through
``stepledger.rllib.instrument``, each with its env runner in this process (``num_env_runners=0``, so
the figure is the env side's cost, not Ray's messaging) stepping ``--envs`` sub-envs. They take turns:
``sample(num_timesteps=--block)`` on one, then on the other (each first every other round),
``--rounds`` times; the median throughput of each (env steps a second) and the median of the rounds'
ratios are printed, so a busy moment on a shared machine hits both alike. Where the load makes that ratio
noise, two figures that depend less on it: the median ratio of this process's CPU time an env step (the
runner steps here; it includes the idle spiller's spills of the instrumented ledgers, which may fall in the
plain algorithm's turn), and stepledger's own time inside the instrumented ``sample()`` (``InCall``: each
sub-env's ``LedgerEnv.step``/``reset`` less the env's own call, plus ``on_sample_end``'s spills), an env step
and as a share of the turn. Then the trainer side: the instrumented algorithm's recorder (in its local
learner) is timed on each block of sampled episodes (what it does once per iteration, as the learner is
handed them), against a whole ``algo.train()`` iteration. Last, the bytes an event on disk, from the closed
ledgers.

    python benchmarks/rllib_overhead.py            # CartPole-v1 and Pendulum-v1, writes RESULTS.md
    python benchmarks/rllib_overhead.py --quick    # a smoke run, writes nothing

Needs Ray RLlib (Ray 2.60 pins gymnasium 1.2.2: run it in a venv of its own, as tests/rllib/test_rllib_venv.py
builds).
"""

import argparse
import glob
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import machine, write_section  # noqa: E402

TARGET_RATIO = 1.05


def _config(env_id, envs, block):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    return (PPOConfig().environment(env_id)
            .env_runners(num_env_runners=0, num_envs_per_env_runner=envs)
            .training(train_batch_size_per_learner=block, minibatch_size=block, num_epochs=1)
            .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[16]))
            .debugging(seed=0, log_level="ERROR"))


class InCall:
    """stepledger's own time on the env runner's sampling path, measured inside the instrumented algorithm:
    each sub-env's ``LedgerEnv.step``/``reset`` less the env's own call inside it (the digests, and the spills
    that fall due on the step path), and the ``attend()`` of stepledger.rllib's ``on_sample_end`` (the spills
    due when a sample() ends). Timers only run while ``on`` is set (the instrumented algorithm's turns)."""

    def __init__(self, algo):
        import stepledger.rllib
        from stepledger import LedgerEnv
        self.on, self.seconds = False, 0.0
        for sub in algo.env_runner.env.unwrapped.envs:
            while not isinstance(sub, LedgerEnv):
                sub = sub.env
            for name in ("step", "reset"):
                setattr(sub, name, self._timed(getattr(sub, name), +1))
                setattr(sub.env, name, self._timed(getattr(sub.env, name), -1))  # the env's own share, taken off
        stepledger.rllib.attend = self._timed(stepledger.rllib.attend, +1)

    def _timed(self, call, sign):
        def timed(*args, **kwargs):
            if not self.on:
                return call(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds += sign * (time.perf_counter() - t0)
        return timed


def measure(env_id, envs, block, rounds, directory):
    import stepledger.rllib
    plain = _config(env_id, envs, block).build_algo()
    ledgered = stepledger.rllib.instrument(_config(env_id, envs, block), directory).build_algo()
    # the trainer side: the local learner's recorder (the first piece of its learner connector), with the
    # offsets the driver works out for each block of episodes it hands the learner group
    recorder, positions = ledgered.learner_group._learner._stepledger_tap.recorder, ledgered._stepledger_positions

    def record(episodes):
        recorder.record(episodes, positions.of(episodes))
    rates = {"plain": [], "ledgers": []}
    cpu = {"plain": [], "ledgers": []}  # this process's CPU seconds an env step (the runner is in it)
    in_call, incall = [], InCall(ledgered)
    record_s, events = [], 0
    try:
        plain.env_runner.sample(num_timesteps=block, explore=True)  # warm up: first reset, forward passes
        record(ledgered.env_runner.sample(num_timesteps=block, explore=True))
        turns = (("plain", plain), ("ledgers", ledgered))
        for r in range(rounds):
            for name, algo in turns[r % 2:] + turns[:r % 2]:  # each goes first every other round
                incall.on, incall.seconds = name == "ledgers", 0.0
                t0, c0 = time.perf_counter(), time.process_time()
                episodes = algo.env_runner.sample(num_timesteps=block, explore=True)
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                incall.on = False
                steps = sum(len(e) for e in episodes)
                rates[name].append(steps / dt)
                cpu[name].append(dc / steps)
                if name == "ledgers":
                    in_call.append((incall.seconds / steps, dt / steps))
                if name == "ledgers":
                    t0 = time.perf_counter()
                    record(episodes)
                    record_s.append(time.perf_counter() - t0)
                    events += steps
        iteration_s = []
        for _ in range(max(3, rounds // 4)):
            t0 = time.perf_counter()
            ledgered.train()
            iteration_s.append(time.perf_counter() - t0)
    finally:
        plain.stop()
        ledgered.stop()
    files = glob.glob(os.path.join(directory, "env-*.npz"))
    from stepledger import read
    n_env = 0
    for path in files:
        with read(path) as ledger:
            n_env += sum(len(s.columns["kind"][:]) for s in ledger.streams.values())
    env_bytes = sum(os.path.getsize(p) for p in files)
    trainer = os.path.join(directory, "trainer.npz")
    with read(trainer) as ledger:
        n_tr = sum(len(s.columns["kind"][:]) for s in ledger.streams.values())
    return {
        "plain": statistics.median(rates["plain"]), "ledgers": statistics.median(rates["ledgers"]),
        # the ratio of each round's two turns, next to each other: load that changes between rounds cancels
        "ratio": statistics.median(p / q for p, q in zip(rates["plain"], rates["ledgers"])),
        "cpu_ratio": statistics.median(q / p for p, q in zip(cpu["plain"], cpu["ledgers"])),
        # stepledger's own time an env step, and the share of the instrumented turn's time it is
        "in_call_us": 1e6 * statistics.median(c for c, _ in in_call),
        "in_call_share": statistics.median(c / w for c, w in in_call),
        "record_ms": 1e3 * statistics.median(record_s), "iteration_ms": 1e3 * statistics.median(iteration_s),
        "env_bytes": env_bytes / max(n_env, 1), "trainer_bytes": os.path.getsize(trainer) / max(n_tr, 1),
        "block": block,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run (few rounds), writes nothing")
    p.add_argument("--envs", type=int, default=4, help="sub-envs of the env runner (default 4)")
    p.add_argument("--block", type=int, default=1000, help="env steps per sample() call (default 1000)")
    p.add_argument("--rounds", type=int, default=15, help="turns each algorithm takes (default 15)")
    args = p.parse_args(argv)
    import ray
    rounds, block = (3, 200) if args.quick else (args.rounds, args.block)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for env_id in ("CartPole-v1", "Pendulum-v1"):
            d = tempfile.mkdtemp(prefix="stepledger-rllib-bench-")
            try:
                r = measure(env_id, args.envs, block, rounds, d)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            ratio = r["ratio"]
            rows.append((env_id, r, ratio))
            print("%s: %.0f env steps/s without ledgers, %.0f with: %.3fx (target at most %.2fx); CPU time an env "
                  "step %.3fx; stepledger's own time in sample() %.1f us an env step, %.2f%% of it; trainer side "
                  "%.2f ms per %d steps recorded, an iteration %.0f ms; %.1f bytes an event on disk (env), %.1f "
                  "(trainer)" % (env_id, r["plain"], r["ledgers"], ratio, TARGET_RATIO, r["cpu_ratio"],
                                 r["in_call_us"], 100 * r["in_call_share"], r["record_ms"], block,
                                 r["iteration_ms"], r["env_bytes"], r["trainer_bytes"]), flush=True)
    finally:
        ray.shutdown()
    if args.quick:
        return 0
    lines = ["## RLlib (benchmarks/rllib_overhead.py)", "", machine(), "",
             "One env runner in the driver's process, %d sub-envs, PPO, blocks of %d env steps taken in turn by the "
             "plain and the instrumented algorithm (%d rounds, medians)." % (args.envs, block, rounds), "",
             "| env | steps/s, no ledgers | steps/s, ledgers | ratio (target <= %.2f) | CPU time ratio | "
             "stepledger in sample(), an env step | trainer side per block | an iteration | bytes/event env | "
             "bytes/event trainer |" % TARGET_RATIO,
             "|---|---|---|---|---|---|---|---|---|---|"]
    for env_id, r, ratio in rows:
        lines.append("| %s | %.0f | %.0f | %.3f | %.3f | %.1f us (%.2f%%) | %.2f ms | %.0f ms | %.1f | %.1f |" % (
            env_id, r["plain"], r["ledgers"], ratio, r["cpu_ratio"], r["in_call_us"], 100 * r["in_call_share"],
            r["record_ms"], r["iteration_ms"], r["env_bytes"], r["trainer_bytes"]))
    write_section("rllib", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
