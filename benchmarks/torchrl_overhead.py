"""What both ledgers cost TorchRL's Collector, side by side with none, on 8 Pendulum envs in worker processes.

Two setups are built at once, each a ``ParallelEnv`` of ``--envs`` Pendulum-v1 envs (TorchRL's ``GymWrapper``)
sampled by a ``Collector`` with random actions from the action spec (no policy): one plain, one with both ledgers
(``ledger_env_fns``: ``LedgerEnv`` in each worker and ``LedgerIndex``; ``LedgerCollector``, which records each
batch). They take turns: one batch of ``--frames`` frames from one, then from the other (each first every other
round), ``--rounds`` times. Printed: the median throughput of each (env steps a second), the median of the
rounds' paired ratios (with ledgers / without; the aim is at most 1.05x), the trainer side's own time (recording
the batches) an env step and as a share of the turn, and, where valgrind is installed, the instructions the
trainer side takes to record one batch under callgrind (repeatable on a loaded machine, where wall time is not).

    python benchmarks/torchrl_overhead.py             # 8 envs, 15 rounds of 1,600-frame batches, writes RESULTS.md
    python benchmarks/torchrl_overhead.py --quick     # a smoke run, writes nothing
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _callgrind  # noqa: E402
from _results import machine, write_section  # noqa: E402

TARGET_RATIO = 1.05


def _pendulum():
    import gymnasium as gym
    return gym.make("Pendulum-v1")


def _plain_env():
    from torchrl.envs import GymWrapper
    return GymWrapper(_pendulum())


def _batches(n, frames, count, directory):
    """``count`` batches of ``frames`` frames from a SerialEnv of n ledgered Pendulum envs, and their env fns."""
    from torchrl.collectors import Collector
    from torchrl.envs import SerialEnv

    from stepledger.torchrl import ledger_env_fns
    fns = ledger_env_fns(_pendulum, n, directory)
    c = Collector(SerialEnv(n, fns), None, frames_per_batch=frames, total_frames=frames * count)
    out = [b.clone() for b in c]
    c.shutdown()
    return out, fns


def count(n, frames):
    """Under callgrind: the trainer side's record of each of 4 batches (``_callgrind.collected``)."""
    from stepledger.torchrl import LedgerCollector
    directory = tempfile.mkdtemp(prefix="stepledger-torchrl-count-")
    batches, fns = _batches(n, frames, 4, directory)
    led = LedgerCollector(_Idle(), os.path.join(directory, "trainer.npz"), fns)
    _callgrind.collected(led.record, batches)
    shutil.rmtree(directory, ignore_errors=True)


class _Idle:
    """A collector that is never iterated (the counting run records batches it already has)."""

    def shutdown(self):
        pass


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", type=int, default=8, help="Pendulum envs in the ParallelEnv (default 8)")
    p.add_argument("--frames", type=int, default=1600, help="frames per batch, over all envs (default 1600)")
    p.add_argument("--rounds", type=int, default=15, help="paired turns (default 15)")
    p.add_argument("--quick", action="store_true", help="2 rounds of 400 frames; print, write nothing")
    p.add_argument("--count", action="store_true", help=argparse.SUPPRESS)  # the run under callgrind
    args = p.parse_args(argv)
    if args.count:
        return count(args.envs, args.frames)
    if args.quick:
        args.rounds, args.frames = 2, 400
    from torchrl.collectors import Collector
    from torchrl.envs import ParallelEnv

    from stepledger.torchrl import LedgerCollector, ledger_env_fns

    n = args.envs
    directory = tempfile.mkdtemp(prefix="stepledger-torchrl-bench-")
    plain = Collector(ParallelEnv(n, [_plain_env] * n), None, frames_per_batch=args.frames, total_frames=-1)
    fns = ledger_env_fns(_pendulum, n, directory)
    led = LedgerCollector(Collector(ParallelEnv(n, fns), None, frames_per_batch=args.frames, total_frames=-1),
                          os.path.join(directory, "trainer.npz"), fns)
    own = [0.0]
    record = led._book.record

    def timed(batch):
        t = time.perf_counter()
        try:
            return record(batch)
        finally:
            own[0] += time.perf_counter() - t

    led._book.record = timed
    its = {plain: iter(plain), led: iter(led)}
    try:
        for c in its:  # warm-up: workers, shared buffers, first batches
            next(its[c])
        own[0] = 0.0
        ratios, rates_plain, rates_led, led_seconds = [], [], [], 0.0
        for r in range(args.rounds):
            order = (plain, led) if r % 2 == 0 else (led, plain)
            took = {}
            for c in order:
                t = time.perf_counter()
                next(its[c])
                took[c] = time.perf_counter() - t
            ratios.append(took[led] / took[plain])
            rates_plain.append(args.frames / took[plain])
            rates_led.append(args.frames / took[led])
            led_seconds += took[led]
        steps = args.rounds * args.frames
    finally:
        plain.shutdown()
        led.shutdown()
    size = os.path.getsize(os.path.join(directory, "trainer.npz"))
    shutil.rmtree(directory, ignore_errors=True)
    ratio = statistics.median(ratios)
    print("median paired ratio %.3fx; counting the trainer side under callgrind (minutes: torch under valgrind)"
          % ratio, flush=True)
    instructions = None if args.quick else _callgrind.per_call(__file__, ["--envs", n, "--frames", args.frames], 4,
                                                               timeout=3600)
    lines = [
        "TorchRL Collector, %d Pendulum-v1 envs in a ParallelEnv (GymWrapper), random actions, %d paired rounds of "
        "%s-frame batches" % (n, args.rounds, f"{args.frames:,}"),
        "",
        "| setup | env steps/s (median) |",
        "| --- | --- |",
        "| no ledger (Collector) | %s |" % f"{statistics.median(rates_plain):,.0f}",
        "| both ledgers (ledger_env_fns + LedgerCollector) | %s |" % f"{statistics.median(rates_led):,.0f}",
        "",
        "median paired ratio (with / without): %.3fx (rounds: %s); target at most %.2fx: %s"
        % (ratio, ", ".join("%.3f" % x for x in ratios), TARGET_RATIO, "met" if ratio <= TARGET_RATIO else "NOT met"),
        "trainer side's own time (recording the batches): %.2f us an env step, %.2f%% of the ledger turns"
        % (1e6 * own[0] / steps, 100.0 * own[0] / led_seconds),
        ("trainer side under callgrind: %s instructions to record one %s-frame batch (%.0f an env step)"
         % (f"{instructions:,.0f}", f"{args.frames:,}", instructions / args.frames)) if instructions else
        "trainer side under callgrind: not counted (%s)" % ("--quick" if args.quick else "no valgrind"),
        "trainer ledger: %s bytes" % f"{size:,}",
        "",
        machine(),
    ]
    text = "\n".join(lines)
    print(text)
    if not args.quick:
        write_section("torchrl_overhead", "## TorchRL (`python benchmarks/torchrl_overhead.py`)\n\n" + text)


if __name__ == "__main__":
    main()
