"""The ``stepledger`` command (also ``python -m stepledger``).

Exit codes: 0 no difference, 1 a difference, 2 cannot compare (or bad usage),
3 no difference among what was compared, but a file named like an env ledger
could not be read and was not compared. With ``--json`` stdout always holds one
JSON object, also on exit 2 (``{"ok": false, "error": "..."}``); with
``--junit FILE`` the file is written on exit 2 too, one failing test case that
carries the error. Progress goes to stderr, and only when stderr is a terminal.
"""

import argparse
import json
import os
import shutil
import sys
from typing import Any

from stepledger.report import jsonout as _jsonout
from stepledger.format import schema as S
from stepledger import wording
from stepledger.__about__ import __version__
from stepledger.errors import LedgerError
from stepledger.cli.progress import Progress

EXIT_OK, EXIT_DIFFER, EXIT_CANNOT, EXIT_NOT_ALL = 0, 1, 2, 3
EXIT_BROKEN_PIPE = 141  # what a shell reports for a process ended by SIGPIPE

_JSON_ERRORS = [False]  # set when the command line asks for --json, so that usage errors print JSON too
_ARGV = [None]  # the command line being run, so that a usage error writes its --junit file too


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors exit 2 with one line (argparse adds the usage too)
        if _JSON_ERRORS[0]:
            print(_jsonout.dumps({"ok": False, "error": "%s: %s" % (self.prog, message)}))
        if _ARGV[0] is not None:
            _junit_of_error(_junit_in(_ARGV[0]), self.prog, "%s: %s" % (self.prog, message))
        self.exit(EXIT_CANNOT, "%s: error: %s (see %s --help)\n" % (self.prog, message, self.prog))


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the descriptions' line breaks and adds each option's default to its help (flags and
    options without a default say what they default to in their own words)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "%(default)" not in text \
                and "default" not in text and action.option_strings:
            text += " (default: %(default)s)"
        return text


from stepledger.libraries import positive_int as _positive_int  # noqa: E402


def _progress(label):
    return Progress("stepledger %s:" % label)


def _report(args, command, check):
    """Run ``check(progress)`` for ``stepledger COMMAND``, print its report (text or JSON), write --junit."""
    progress = _progress("%s, envs" % command)
    try:
        report = check(progress)
    finally:
        progress.done()
    if args.junit:
        from stepledger.report.junit import write_junit
        write_junit(args.junit, report, "stepledger %s" % command)
    if getattr(args, "html", None):
        from stepledger.report.html import write_html
        write_html(report, args.html, _compared(args))
    print(report.to_json() if args.json else str(report))
    if not report.ok:
        return EXIT_DIFFER
    return EXIT_OK if getattr(report, "complete", True) else EXIT_NOT_ALL


def _jobs(text):
    from stepledger.report.parallel import check_jobs
    try:
        return check_jobs(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(wording.bad_jobs(repr(text))) from None  # after "argument --jobs: "


def _compared(args):
    """What a compare compared, as its command line names it (the HTML page's title)."""
    return " ".join(["stepledger compare", args.env_dir] + list(args.trainer_file))


def _compare(args):
    from stepledger.report.compare import compare
    trainers = args.trainer_file[0] if len(args.trainer_file) == 1 else args.trainer_file
    return _report(args, "compare", lambda progress: compare(args.env_dir, trainers, count_all=args.all,
                                                             progress=progress, jobs=args.jobs, ray=args.ray))


def _stream_counts(ledger):
    """[{"env", "events", "episodes", "steps"}] of each stream of a ledger read back."""
    import numpy as np
    streams = []
    for idx, stream in ledger.streams.items():
        n_events = n_resets = 0
        for chunk in stream.chunks(names=("kind",)):
            n_events += len(chunk["kind"])
            n_resets += int(np.count_nonzero(np.asarray(chunk["kind"]) == S.KIND_RESET))
        streams.append({"env": idx, "events": n_events, "episodes": n_resets, "steps": n_events - n_resets})
    return streams


def _is_directory(path):
    from stepledger.format import storage
    text = storage.local_path(os.fspath(path))
    if text.rstrip("/").endswith(".spill"):
        return False
    return storage.isdir(text) if storage.is_remote(text) else os.path.isdir(text)


def _show_directory(args, ledger, streams, leftovers, left):
    """``stepledger show DIR``: the directory as a directory, one line per ledger (docs/READING.md)."""
    from stepledger.report.compare import how_it_ended
    from stepledger.report.read import other_ledgers, read
    others, unreadable = [], []
    for path in other_ledgers(args.path):
        try:
            with read(path) as other:
                others.append((os.path.basename(path), other.meta, _stream_counts(other), other.partial))
        except LedgerError as exc:  # an episode log, a file that is not a ledger: named, the rest shown
            unreadable.append((os.path.basename(path), str(exc)))
    trainers = [meta for _, meta, _, _ in others if meta.get(S.META_SIDE) == "trainer"]
    by_file: dict[str, list[Any]] = {}  # a multi-agent env ledger holds a stream per agent
    for s in streams:
        by_file.setdefault(ledger.origin.get(s["env"], "env-%d.npz" % s["env"]), []).append(s)
    ledgers: list[tuple[Any, ...]] = []  # (name, meta, streams, partial, what, events, resets)
    for name, counts in by_file.items():
        meta = ledger.streams[counts[0]["env"]].meta
        agents = meta.get(S.META_POSSIBLE_AGENTS)
        what = "env %s" % name[4:-4] if not agents else "env %s, %s" % (name[4:-4], wording.count(len(agents), "agent"))
        ledgers.append((name, meta, counts, None, what, sum(c["events"] for c in counts),
                        sum(c["episodes"] for c in counts)))
    for name, idx, meta in getattr(ledger, "duplicates", []):
        copy = meta.get(S.META_COPY)
        what = ("a copy of env %d's LedgerEnv (%s)" % (idx, wording.COPY_MADE[copy].format(index=idx).split(":")[0])
                if copy in wording.COPY_MADE else "a second recording of env %d" % idx)
        ledgers.append((name, meta, None, None, what, ledger.duplicate_events.get(name, 0), None))
    for name, meta, events, _ in getattr(ledger, "unindexed", []):
        ledgers.append((name, meta, None, None, "no index at its first event", events, None))
    for name, meta, counts, partial in others:
        empty = sum(1 for c in counts if not c["events"])
        what = wording.show_trainer_streams(len(counts), empty) if meta.get(S.META_SIDE) == "trainer" else \
            "%s side" % meta.get(S.META_SIDE)
        events = sum(c["events"] for c in counts)
        ledgers.append((name, meta, [c for c in counts if c["events"]], partial, what, events, None))
    if args.json:
        print(_jsonout.dumps({"path": ledger.path, "ledgers": [
            {"name": name, "meta": meta, "events": events, "streams": counts, "partial": partial}
            for name, meta, counts, partial, _, events, _ in ledgers],
            "leftover_stages": leftovers[0], "leftovers": [{"name": n, "why": w} for n, w in left],
            "not_read": [{"name": n, "why": w} for n, w in unreadable]}))
        return EXIT_OK
    print(wording.show_directory(ledger.path, len(ledgers) - len(others), len(trainers), len(others) - len(trainers),
                                 sum(entry[5] for entry in ledgers),
                                 ledger.partial or any(partial for _, _, _, partial in others)))
    for name, meta, _, partial, what, events, resets in ledgers:
        ended = how_it_ended(meta, trainers)
        if partial:
            ended = (ended or "closed") + ", partial (read from spilled segments)"
        print(wording.show_ledger(name, what, events, resets, ended, meta.get(S.META_STARTED),
                                  meta.get(S.META_UPDATED), meta.get(S.META_PID)))
    for line in leftovers[1]:
        print(line)
    for name, why in left:
        print("  not a ledger: %s (%s)" % (name, why))
    for name, why in getattr(ledger, "skipped", []):
        print("  not read: %s %s" % (name, why))
    for name, why in unreadable:
        print("  not read: %s (%s)" % (name, why))
    return EXIT_OK


def _show(args):
    from stepledger.report.read import leftovers as leftover_files
    from stepledger.report.read import read
    with read(args.path) as ledger:
        streams = _stream_counts(ledger)
        leftovers = _leftover_stages(ledger.path)
        left = leftover_files(args.path)
        if _is_directory(args.path):
            return _show_directory(args, ledger, streams, leftovers, left)
        if args.json:
            print(_jsonout.dumps({"path": ledger.path, "partial": ledger.partial, "meta": ledger.meta,
                                  "streams": streams, "leftover_stages": leftovers[0],
                                  "unindexed": [{"name": n, "events": k, "position": m.get(S.META_POSITION)}
                                                for n, m, k, _ in getattr(ledger, "unindexed", [])],
                                  "leftovers": [{"name": n, "why": w} for n, w in left]}))
            return EXIT_OK
        print("%s: %s side%s" % (ledger.path, ledger.side, ", partial (read from spilled segments)"
                                 if ledger.partial else ""))
        for key in sorted(ledger.meta):
            value = ledger.meta[key]
            text = wording.show_date(value) if key in (S.META_STARTED, S.META_UPDATED) else \
                json.dumps(_jsonout.plain(value), sort_keys=True)
            print("  %s: %s" % (key, text))
        shown = [s for s in streams if s["events"]]
        print(wording.show_streams(len(streams), len(streams) - len(shown), sum(s["events"] for s in streams)))
        for s in shown:
            print(wording.show_stream(s["env"], s["events"], s["episodes"]))
        for line in leftovers[1]:
            print(line)
        for name, why in left:
            print("  not a ledger: %s (%s)" % (name, why))
        for name, why in getattr(ledger, "skipped", []):
            print("  not read: %s %s" % (name, why))
        for name, meta, events, _ in getattr(ledger, "unindexed", []):
            print("  not read: %s" % wording.unindexed_note(name, events, meta.get(S.META_POSITION)))
    return EXIT_OK


def _leftover_stages(path):
    """Stage directories of dead processes in TMPDIR (ledgers at URLs are staged there), for ``show``."""
    from stepledger.format import storage
    if not storage.is_remote(path):
        return [], []
    from stepledger.format.remote import describe_leftovers, leftover_stages
    return leftover_stages(), describe_leftovers()


def _command(sub, name, func, summary, description, examples, footer=None):
    """A subcommand: its one-line summary, its description, and an epilog of examples (and a footer, such
    as its exit codes); options show their defaults."""
    description = " ".join(description.split())  # a paragraph, written over several lines
    epilog = "example:\n" + "\n".join("  " + e for e in examples) + ("\n\n" + footer if footer else "")
    p = sub.add_parser(name, help=summary, formatter_class=_Formatter, description=description, epilog=epilog)
    p.set_defaults(func=func)
    return p


def _push(args):
    from stepledger.format.remote import push
    n = push(args.local, args.url, remove=not args.keep)
    print("published %d file%s to %s%s" % (n, "" if n == 1 else "s", args.url,
                                           "" if args.keep else "; the local copies are removed"))
    return EXIT_OK


def _add_push(sub):
    p = _command(sub, "push", _push, "publish ledgers kept on local disk (storage failed) to their URL",
                 description="""Upload a ledger file, or a directory of them (env-N.npz, trainer.npz and their spill
                              segments), to storage: what a run kept on local disk when its storage failed. The line
                              that said where a ledger was kept gives the command.""",
                 examples=["stepledger push ~/.local/share/stepledger/unpublished/s3/bucket/run-1 s3://bucket/run-1"])
    p.add_argument("local", help="a ledger file or a directory of ledger files")
    p.add_argument("url", help="where it belongs: the ledger's URL, or the directory's")
    p.add_argument("--keep", action="store_true", help="keep the local copies (default: remove each once stored)")


def build_parser():
    from stepledger import core
    p = _Parser(prog="stepledger", description="Find silent faults at the environment-trainer boundary.")
    p.add_argument("--version", action="version", version="stepledger %s (core: %s)" % (__version__, core.IMPLEMENTATION))
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    c = _command(sub, "compare", _compare, "compare the env-side ledgers with the trainer ledger",
                 description="""Compare the env-side ledgers (ENV_DIR/env-N.npz) with the trainer ledger and print,
                              per env, the first event where they differ. A run with several learners or trainer
                              processes gives several trainer files (or a quoted glob, or a directory of them): each
                              env must be in exactly one.""",
                 examples=["stepledger compare ledger ledger/trainer.npz",
                           "stepledger compare ledger ledger/trainer.npz --json --junit report.xml",
                           "stepledger compare ledger ledger/trainer.npz --all --html report.html",
                           "stepledger compare ledger 'ledger/trainer-*.npz'",
                           "stepledger compare ledger ledger     (env-N.npz and trainer-*.npz together)"],
                 footer="exit codes: 0 no difference, 1 a difference, 2 cannot compare, 3 no difference in what was "
                        "compared, but a file named like an env ledger could not be read (the report names it)\n"
                        "how to read the report: stepledger docs report")
    c.add_argument("env_dir", help="the directory LedgerEnv wrote env-N.npz into; or one env-N.npz, to compare "
                                   "that env alone")
    c.add_argument("trainer_file", nargs="+", metavar="TRAINER_FILE",
                   help="the file LedgerVectorEnv, LedgerVecEnv or TrainerLedger wrote; or several, a glob of them "
                        "(quoted, so that a learner killed before its final file is found by its segments), or a "
                        "directory holding them")
    c.add_argument("--json", action="store_true",
                   help="print the report as JSON (its keys: stepledger docs report)")
    c.add_argument("--all", action="store_true",
                   help="also count, per env and field, the events that differ after the first, and say where "
                        "they fall")
    c.add_argument("--junit", metavar="FILE",
                   help="also write a JUnit XML report to FILE, one test case per env (on exit 2, one failing "
                        "test case that carries the error)")
    c.add_argument("--jobs", metavar="N", type=_jobs, default=None,
                   help="compare the envs in N worker processes (default: the cores this process may run on; a "
                        "small compare runs in one process); the report is the same")
    c.add_argument("--ray", metavar="ADDRESS", nargs="?", const=True, default=None,
                   help="compare the envs as Ray tasks on the cluster at ADDRESS (without ADDRESS: the one "
                        "RAY_ADDRESS names, or 'auto'), each task reading its ledgers from the path or URL "
                        "itself (one task per CPU of the cluster, or --jobs N tasks); needs Ray")
    c.add_argument("--html", metavar="FILE",
                   help="also write the report as one self-contained HTML page to FILE: the summary, a row per "
                        "stream with where it differs (with --all, where every difference falls), both sides' "
                        "values (on exit 2, a page with the error)")

    s = _command(sub, "show", _show, "describe a ledger file or an env directory",
                 description="Print a ledger's meta, its streams and their event and episode counts.",
                 examples=["stepledger show ledger/trainer.npz", "stepledger show ledger"])
    s.add_argument("path", help="a ledger file or an env directory")
    s.add_argument("--json", action="store_true", help="print as JSON")

    d = _command(sub, "docs", _docs, "print one of the documentation pages shipped with stepledger",
                 description="Print a documentation page. Without a page, list the pages.",
                 examples=["stepledger docs", "stepledger docs report"])
    d.add_argument("page", nargs="?", help="a page name, such as report, format or live")

    for extra in _EXTRA_COMMANDS:
        extra(sub)
    return p


def _docs(args):
    from stepledger.cli.docs import page_names, page_text
    if not args.page:
        print("stepledger docs PAGE, where PAGE is one of: %s" % ", ".join(page_names()))
        return EXIT_OK
    sys.stdout.write(page_text(args.page))
    return EXIT_OK


def _demo(args):
    from stepledger.cli.demo import run
    made = args.dir is None
    report, directory = run(fault=not args.clean, directory=args.dir, keep_values=args.keep_values)
    print(report)
    if made and not args.keep:
        shutil.rmtree(directory, ignore_errors=True)
        print("(the ledgers were in a temporary directory, now removed; --keep or --dir DIR keeps them)")
    else:
        print("ledgers in %s (compare them again: stepledger compare %s %s)"
              % (directory, directory, os.path.join(directory, "trainer.npz")))
    return EXIT_OK if report.ok == args.clean else EXIT_DIFFER


def _check(args):
    from stepledger import libraries
    lib = libraries.by_trainer(args.trainer)
    lib.require("--trainer %s" % args.trainer)
    run = lib.function(lib.check)  # type: ignore[arg-type]  # a library with a --trainer has a check
    progress = _progress("check, runs")
    try:
        report = run(args, progress)
    finally:
        progress.done()
    if args.junit:
        from stepledger.report.junit import write_junit
        write_junit(args.junit, report, "stepledger check")
    print(report)
    return EXIT_OK if report.ok else EXIT_DIFFER


def _add_demo(sub):
    d = _command(sub, "demo", _demo, "run a short AsyncVectorEnv with faults injected and print the report",
                 description="""Run 8 Pendulum-v1 envs in an AsyncVectorEnv for 100 steps, with three of them changing
                              one value on the way to the trainer, and compare the two ledgers.""",
                 examples=["stepledger demo", "stepledger demo --keep-values", "stepledger demo --clean"])
    d.add_argument("--clean", action="store_true", help="inject no fault: the report must be clean")
    d.add_argument("--keep-values", action="store_true",
                   help="record with keep_values=True on both sides, so that the report prints the observations "
                        "and actions that differ (by default the ledgers keep their digests only)")
    d.add_argument("--dir", help="where to write the ledgers (default: a temporary directory, removed at the end)")
    d.add_argument("--keep", action="store_true", help="keep the temporary directory and print where it is")


def _add_check(sub):
    c = _command(sub, "check", _check, "prove that the ledgers catch every boundary fault on a registered env",
                 description="""Run a short random rollout of ENV_ID through the chosen vector env with both ledgers,
                              then once per fault with the fault injected in the workers, and report whether each
                              was caught and located.""",
                 examples=["stepledger check Pendulum-v1 --vector async --autoreset same",
                           "stepledger check CartPole-v1 --vector subproc",
                           "stepledger check CartPole-v1 --trainer rllib --num-envs 2",
                           "stepledger check mpe2.simple_spread_v3 --trainer supersuit --num-cpus 2"],
                 footer="exit codes: 0 every exercised fault caught and located, 1 not (or the rollout is too "
                        "short for some fault), 2 cannot run\n"
                        "the faults: stepledger docs faults")
    c.add_argument("env_id", help="a registered Gymnasium env id (with --trainer supersuit: a PettingZoo env module, "
                                  "such as mpe2.simple_spread_v3, whose parallel_env() makes the env)")
    from stepledger import libraries
    every = libraries.every()
    c.add_argument("--vector", choices=libraries.vector_kinds(), default="sync",
                   help="the vector env: " + libraries.vector_help())
    c.add_argument("--autoreset", choices=("next", "same"), default="next",
                   help="autoreset mode of Gymnasium's vector envs")
    c.add_argument("--trainer", choices=[lib.trainer for lib in every if lib.trainer], default="vector",
                   help=libraries.trainer_help())
    for lib in every:
        for flag, options in lib.options:
            c.add_argument(flag, **options)
    c.add_argument("--num-envs", type=_positive_int, default=4, help="envs in the vector env (per env runner with "
                                                                     "--trainer rllib; env copies with --trainer "
                                                                     "supersuit)")
    c.add_argument("--steps", type=_positive_int, default=200, help="vector steps per run")
    c.add_argument("--max-episode-steps", type=_positive_int, default=20,
                   help="time limit, so that episode-end faults have opportunities (with --trainer supersuit: the "
                        "env's max_cycles, where its parallel_env() takes one)")
    c.add_argument("--faults", help="comma-separated faults (default: every env-side fault; with --trainer "
                                    "supersuit, every multi-agent fault the form can show)")
    c.add_argument("--dir", help="where to write the ledgers (default: a temporary directory, removed when the "
                                 "check passes)")
    c.add_argument("--keep", action="store_true", help="keep the temporary directory even when the check passes")
    c.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report to FILE, one test case per fault "
                                                   "(on exit 2, one failing test case that carries the error)")


def _episodes(args):
    from stepledger.report.episodes import check_episodes
    if _is_rllib_log(args.log):  # an instrumented multi-agent RLlib run's own episode metrics
        from stepledger.rllib.episodes import check_rllib_episodes
        return _report(args, "episodes", lambda progress: check_rllib_episodes(
            args.env_dir, args.log, rtol=args.rtol, atol=args.atol))
    return _report(args, "episodes", lambda progress: check_episodes(
        args.env_dir, args.log, env=args.env, match=args.match, rtol=args.rtol, atol=args.atol, progress=progress))


def _is_rllib_log(log):
    """An RLlib run's rllib-episodes-*.jsonl (a file, a glob of them, or a directory holding them)."""
    import glob
    import os
    log = str(log)
    return log.endswith(".jsonl") or (os.path.isdir(log) and bool(glob.glob(os.path.join(log, "rllib-episodes-*"))))


def _add_episodes(sub):
    e = _command(sub, "episodes", _episodes, "check the trainer's episode log against the episodes the envs recorded",
                 description="""Derive each env's episode returns and lengths from the env-side ledgers
                              (ENV_DIR/env-N.npz) and check the trainer's episode log against them: SB3's
                              monitor.csv (VecMonitor or Monitor), the .npz EpisodeLogTap writes, or a CSV with
                              columns env, r, l. More: stepledger docs episodes.""",
                 examples=["stepledger episodes ledger ledger/episodes.npz",
                           "stepledger episodes ledger logs/monitor.csv"],
                 footer="exit codes: 0 the log agrees, 1 it differs, 2 cannot check")
    e.add_argument("env_dir", help="the directory LedgerEnv wrote env-N.npz into")
    e.add_argument("log", help="monitor.csv, a directory of N.monitor.csv, or EpisodeLogTap's .npz")
    e.add_argument("--json", action="store_true", help="print the report as JSON")
    e.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report to FILE, one test case per env "
                                                   "(on exit 2, one failing test case that carries the error)")
    e.add_argument("--env", type=int, help="the env index of a log that names none (a single Monitor's file)")
    e.add_argument("--match", choices=("auto", "env", "order", "multiset"), default="auto",
                   help="how to pair logged and recorded episodes (auto: per env if the log knows the env, "
                        "else in completion order if derivable, else as a multiset)")
    e.add_argument("--rtol", type=float, default=1e-5,
                   help="return tolerance relative to the episode's sum of |reward|")
    e.add_argument("--atol", type=float, default=1e-5, help="absolute return tolerance per episode")


_EXTRA_COMMANDS = [_add_demo, _add_check, _add_episodes, _add_push]


def _junit_in(argv):
    """The FILE of ``--junit FILE`` (or ``--junit=FILE``) in a command line, or None."""
    for k, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--junit" and k + 1 < len(argv):
            return argv[k + 1]
        if arg.startswith("--junit="):
            return arg[len("--junit="):]
    return None


def _junit_of_error(path, name, message):
    """Exit 2 with --junit: the file all the same, one failing test case that carries the error, so that a CI
    step that collects the file finds it. Nothing if it cannot be written (the error line says enough)."""
    if not path:
        return
    from stepledger.report.junit import write_junit_error
    try:
        write_junit_error(path, name, message)
    except (OSError, ValueError):
        pass


def _cannot(args, message):
    """Exit 2: one line on stderr, with --json an error object on stdout, with --junit a failing test case."""
    message = " ".join(str(message).split())
    if getattr(args, "json", False):
        print(_jsonout.dumps({"ok": False, "error": message}))
    if getattr(args, "junit", None):
        _junit_of_error(args.junit, "stepledger %s" % args.command, message)
    if getattr(args, "html", None):
        from stepledger.report.html import write_html_error
        try:
            write_html_error(args.html, message, _compared(args))
        except (OSError, ValueError):
            pass
    print("stepledger: %s" % message, file=sys.stderr)
    return EXIT_CANNOT


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    _JSON_ERRORS[0] = "--json" in argv
    _ARGV[0] = argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_CANNOT
        try:
            return args.func(args)
        except (LedgerError, ValueError, ImportError, OSError) as exc:
            if isinstance(exc, BrokenPipeError):
                raise
            return _cannot(args, exc)
        except KeyboardInterrupt:
            return 130
    except BrokenPipeError:
        # the reader went away (``stepledger show ... | head``): end quietly, as a shell tool does
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE
    finally:
        _JSON_ERRORS[0] = False
        _ARGV[0] = None


if __name__ == "__main__":
    sys.exit(main())
