"""What both ledgers cost Tianshou's Collector, side by side with none, on 8 Pendulum envs in worker processes.

Two setups are built at once, each a ``SubprocVectorEnv`` of ``--envs`` Pendulum-v1 envs and a collector of
Tianshou's ``RandomActionPolicy`` (its forward pass and ``map_action`` run as a policy's would) into a
``VectorReplayBuffer``: one plain (``Collector``, the bare envs), one with both ledgers (``ledger_env_fns``:
``LedgerEnv`` in each worker; ``LedgerCollector``, which also reads each collect's transitions back from the
buffer). They take turns: ``collect(n_step=--block)`` on one, then on the other (each first every other round),
``--rounds`` times. Printed: the median throughput of each (env steps a second), the median of the rounds'
paired ratios (with ledgers / without; the aim is at most 1.05x), and the trainer side's own time in the
ledger turns (the collector's tap and its read-back of the buffer), an env step and as a share of the turn.

    python benchmarks/tianshou_overhead.py             # 8 envs, 15 rounds of 4,000 env steps, writes RESULTS.md
    python benchmarks/tianshou_overhead.py --quick     # a smoke run, writes nothing
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import machine, write_section  # noqa: E402

TARGET_RATIO = 1.05


def _pendulum():
    import gymnasium as gym
    return gym.make("Pendulum-v1")


class _Timed:
    """Adds up the seconds spent in ``obj.name`` (a bound method, replaced on the instance)."""

    def __init__(self, obj, name):
        self.seconds, inner = 0.0, getattr(obj, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t

        setattr(obj, name, timed)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", type=int, default=8, help="Pendulum envs in the SubprocVectorEnv (default 8)")
    p.add_argument("--block", type=int, default=4000, help="env steps per collect() turn (default 4000)")
    p.add_argument("--rounds", type=int, default=15, help="paired turns (default 15)")
    p.add_argument("--quick", action="store_true", help="2 rounds of 800 steps; print, write nothing")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.block = 2, 800
    from tianshou.algorithm.algorithm_base import RandomActionPolicy
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import SubprocVectorEnv

    from stepledger.tianshou import LedgerCollector, ledger_env_fns

    n = args.envs
    directory = tempfile.mkdtemp(prefix="stepledger-tianshou-bench-")
    plain_envs = SubprocVectorEnv([_pendulum] * n)
    ledger_envs = SubprocVectorEnv(ledger_env_fns(_pendulum, n, directory))
    size = 2 * args.block
    plain = Collector(RandomActionPolicy(plain_envs.action_space[0]), plain_envs, VectorReplayBuffer(size, n))
    led = LedgerCollector(RandomActionPolicy(ledger_envs.action_space[0]), ledger_envs, VectorReplayBuffer(size, n),
                          path=os.path.join(directory, "trainer.npz"))
    tap = _Timed(led.env, "step"), _Timed(led.env, "reset")
    env_step_calls = _Timed(led.env.venv, "step"), _Timed(led.env.venv, "reset")  # the vector env's own time
    book = _Timed(led._book, "record")
    try:
        plain.reset()
        led.reset()
        plain.collect(n_step=n * 20)  # warm-up: workers, numba, first buffer allocation
        led.collect(n_step=n * 20)
        for t in tap + env_step_calls + (book,):
            t.seconds = 0.0
        ratios, rates_plain, rates_led, led_seconds = [], [], [], 0.0
        for r in range(args.rounds):
            order = (plain, led) if r % 2 == 0 else (led, plain)
            took = {}
            for c in order:
                t = time.perf_counter()
                c.collect(n_step=args.block)
                took[c] = time.perf_counter() - t
            ratios.append(took[led] / took[plain])
            rates_plain.append(args.block / took[plain])
            rates_led.append(args.block / took[led])
            led_seconds += took[led]
        steps = args.rounds * args.block
        own = sum(t.seconds for t in tap) - sum(t.seconds for t in env_step_calls) + book.seconds
    finally:
        plain.close()
        led.close()
    events = os.path.getsize(os.path.join(directory, "trainer.npz"))
    shutil.rmtree(directory, ignore_errors=True)
    ratio = statistics.median(ratios)
    lines = [
        "Tianshou Collector, %d Pendulum-v1 envs in a SubprocVectorEnv, RandomActionPolicy, %d paired rounds of "
        "%s env steps" % (n, args.rounds, f"{args.block:,}"),
        "",
        "| setup | env steps/s (median) |",
        "| --- | --- |",
        "| no ledger (Collector) | %s |" % f"{statistics.median(rates_plain):,.0f}",
        "| both ledgers (ledger_env_fns + LedgerCollector) | %s |" % f"{statistics.median(rates_led):,.0f}",
        "",
        "median paired ratio (with / without): %.3fx (rounds: %s); target at most %.2fx: %s"
        % (ratio, ", ".join("%.3f" % x for x in ratios), TARGET_RATIO, "met" if ratio <= TARGET_RATIO else "NOT met"),
        "trainer side's own time (tap less the vector env's calls, plus the read-back): %.2f us an env step, "
        "%.2f%% of the ledger turns" % (1e6 * own / steps, 100.0 * own / led_seconds),
        "trainer ledger: %s bytes for %s env steps" % (f"{events:,}", f"{steps + n * 20:,}"),
        "",
        machine(),
    ]
    text = "\n".join(lines)
    print(text)
    if not args.quick:
        write_section("tianshou_overhead", "## Tianshou (`python benchmarks/tianshou_overhead.py`)\n\n" + text)


if __name__ == "__main__":
    main()
