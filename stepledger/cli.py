"""The ``stepledger`` command (also ``python -m stepledger``).

Exit codes: 0 no difference, 1 a difference, 2 cannot compare (or bad usage).
"""

import argparse
import json
import os
import sys

from . import _schema as S
from .__about__ import __version__
from .errors import LedgerError

EXIT_OK, EXIT_DIFFER, EXIT_CANNOT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors exit 2 with one line, as argparse does
        self.print_usage(sys.stderr)
        self.exit(EXIT_CANNOT, "%s: error: %s\n" % (self.prog, message))


def _compare(args):
    from .compare import compare
    report = compare(args.env_dir, args.trainer_file, count_all=args.all)
    print(report.to_json() if args.json else str(report))
    return EXIT_OK if report.ok else EXIT_DIFFER


def _show(args):
    import numpy as np

    from .read import read
    with read(args.path) as ledger:
        streams = []
        for idx, stream in ledger.streams.items():
            n_events = n_resets = 0
            for chunk in stream.chunks(names=("kind",)):
                n_events += len(chunk["kind"])
                n_resets += int(np.count_nonzero(np.asarray(chunk["kind"]) == S.KIND_RESET))
            streams.append({"env": idx, "events": n_events, "episodes": n_resets, "steps": n_events - n_resets})
        if args.json:
            print(json.dumps({"path": ledger.path, "partial": ledger.partial, "meta": ledger.meta,
                              "streams": streams}, indent=2, sort_keys=True))
            return EXIT_OK
        print("%s: %s side%s" % (ledger.path, ledger.side, ", partial (read from spilled segments)"
                                 if ledger.partial else ""))
        for key in sorted(ledger.meta):
            print("  %s: %s" % (key, json.dumps(ledger.meta[key], sort_keys=True)))
        print("  %d streams, %d events" % (len(streams), sum(s["events"] for s in streams)))
        for s in streams:
            print("  env %d: %d events, %d episodes started, %d steps" % (s["env"], s["events"], s["episodes"], s["steps"]))
    return EXIT_OK


def build_parser():
    from . import core
    p = _Parser(prog="stepledger", description="Find silent faults at the environment-trainer boundary.")
    p.add_argument("--version", action="version", version="stepledger %s (core: %s)" % (__version__, core.IMPLEMENTATION))
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    c = sub.add_parser("compare", help="compare the env-side ledgers with the trainer ledger",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Compare the env-side ledgers (ENV_DIR/env-N.npz) with the trainer ledger and "
                                   "print, per env, the first event where they differ.",
                       epilog="example:\n  stepledger compare ledger ledger/trainer.npz\n\n"
                              "exit codes: 0 no difference, 1 a difference, 2 cannot compare")
    c.add_argument("env_dir", help="the directory LedgerEnv wrote env-N.npz into")
    c.add_argument("trainer_file", help="the file LedgerVectorEnv or LedgerVecEnv wrote")
    c.add_argument("--json", action="store_true", help="print the report as JSON (see docs/REPORT.md)")
    c.add_argument("--all", action="store_true",
                   help="also count, per env and field, the events that differ after the first")
    c.set_defaults(func=_compare)

    s = sub.add_parser("show", help="describe a ledger file or an env directory",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Print a ledger's meta, its streams and their event and episode counts.",
                       epilog="example:\n  stepledger show ledger/trainer.npz\n  stepledger show ledger")
    s.add_argument("path", help="a ledger file or an env directory")
    s.add_argument("--json", action="store_true", help="print as JSON")
    s.set_defaults(func=_show)

    for extra in _EXTRA_COMMANDS:
        extra(sub)
    return p


def _demo(args):
    from .demo import run
    report, directory = run(fault=not args.clean, directory=args.dir)
    print(report)
    print("ledgers in %s (compare them again: stepledger compare %s %s)"
          % (directory, directory, os.path.join(directory, "trainer.npz")))
    return EXIT_OK if report.ok == args.clean else EXIT_DIFFER


def _check(args):
    from .check import check_boundary, registered_env
    from .faults import ENV_SIDE_FAULTS, check_fault
    faults = ENV_SIDE_FAULTS if not args.faults else [check_fault(f, ENV_SIDE_FAULTS, "--faults")
                                                      for f in args.faults.split(",")]
    report = check_boundary(registered_env(args.env_id, args.max_episode_steps), vector=args.vector,
                            autoreset=args.autoreset, n_envs=args.num_envs, steps=args.steps, faults=faults,
                            directory=args.dir)
    print(report)
    return EXIT_OK if report.ok else EXIT_DIFFER


def _add_demo(sub):
    d = sub.add_parser("demo", help="run a short AsyncVectorEnv with faults injected and print the report",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run 8 Pendulum-v1 envs in an AsyncVectorEnv for 100 steps, with three of them "
                                   "changing one value on the way to the trainer, and compare the two ledgers.",
                       epilog="example:\n  stepledger demo\n  stepledger demo --clean")
    d.add_argument("--clean", action="store_true", help="inject no fault: the report must be clean")
    d.add_argument("--dir", help="where to write the ledgers (default: a new temporary directory)")
    d.set_defaults(func=_demo)


def _add_check(sub):
    c = sub.add_parser("check", help="prove that the ledgers catch every boundary fault on a registered env",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run a short random rollout of ENV_ID through the chosen vector env with both "
                                   "ledgers, then once per fault with the fault injected in the workers, and "
                                   "report whether each was caught and located.",
                       epilog="example:\n  stepledger check Pendulum-v1 --vector async --autoreset same\n"
                              "  stepledger check CartPole-v1 --vector subproc\n\n"
                              "exit codes: 0 every exercised fault caught and located, 1 not, 2 cannot run")
    c.add_argument("env_id", help="a registered Gymnasium env id")
    c.add_argument("--vector", choices=("sync", "async", "subproc", "dummy"), default="sync")
    c.add_argument("--autoreset", choices=("next", "same"), default="next",
                   help="autoreset mode of Gymnasium's vector envs")
    c.add_argument("--num-envs", type=int, default=4)
    c.add_argument("--steps", type=int, default=200, help="vector steps per run")
    c.add_argument("--max-episode-steps", type=int, default=20,
                   help="time limit, so that episode-end faults have opportunities")
    c.add_argument("--faults", help="comma-separated faults (default: every env-side fault)")
    c.add_argument("--dir", help="where to write the ledgers (default: a new temporary directory)")
    c.set_defaults(func=_check)


def _episodes(args):
    from .episodes import check_episodes
    report = check_episodes(args.env_dir, args.log, env=args.env, match=args.match, rtol=args.rtol, atol=args.atol)
    print(report.to_json() if args.json else str(report))
    return EXIT_OK if report.ok else EXIT_DIFFER


def _add_episodes(sub):
    e = sub.add_parser("episodes", help="check the trainer's episode log against the episodes the envs recorded",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Derive each env's episode returns and lengths from the env-side ledgers "
                                   "(ENV_DIR/env-N.npz) and check the trainer's episode log against them: SB3's "
                                   "monitor.csv (VecMonitor or Monitor), the .npz EpisodeLogTap writes, or a CSV "
                                   "with columns env, r, l. See docs/EPISODES.md.",
                       epilog="example:\n  stepledger episodes ledger ledger/episodes.npz\n"
                              "  stepledger episodes ledger logs/monitor.csv\n\n"
                              "exit codes: 0 the log agrees, 1 it differs, 2 cannot check")
    e.add_argument("env_dir", help="the directory LedgerEnv wrote env-N.npz into")
    e.add_argument("log", help="monitor.csv, a directory of N.monitor.csv, or EpisodeLogTap's .npz")
    e.add_argument("--json", action="store_true", help="print the report as JSON")
    e.add_argument("--env", type=int, help="the env index of a log that names none (a single Monitor's file)")
    e.add_argument("--match", choices=("auto", "env", "order", "multiset"), default="auto",
                   help="how to pair logged and recorded episodes (default: per env if the log knows the env, "
                        "else in completion order if derivable, else as a multiset)")
    e.add_argument("--rtol", type=float, default=1e-5,
                   help="return tolerance relative to the episode's sum of |reward| (default 1e-5)")
    e.add_argument("--atol", type=float, default=1e-5, help="absolute return tolerance per episode (default 1e-5)")
    e.set_defaults(func=_episodes)


_EXTRA_COMMANDS = [_add_demo, _add_check, _add_episodes]


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_CANNOT
    try:
        return args.func(args)
    except (LedgerError, ValueError, ImportError) as exc:
        print("stepledger: %s" % exc, file=sys.stderr)
        return EXIT_CANNOT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
