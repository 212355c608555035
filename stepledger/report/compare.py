"""Comparing the two sides: the first difference per env, and the report users read.

``compare(env_dir, trainer_file)`` streams both ledgers chunk by chunk, so it
runs in bounded memory whatever their length, and stops reading an env's
streams at their first difference unless every difference is to be counted.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from stepledger.format import schema as S
from stepledger import core
from stepledger.format import processes
from stepledger.format import storage
from stepledger import wording
from stepledger.report.base import DifferenceReport
from stepledger.report import parallel
from stepledger.errors import LedgerError, SettingsError
from stepledger.format.ledgerfile import CHUNK, positions
from stepledger.report.read import (FIRST_EVENTS, ON_DEMAND, Columns, Ledger, LedgerPath, MergedLedger, Meta, Overlap,
                                    Stream, TrainerSpec, env_indices_of, fragments_of, read, read_ledger,
                                    read_trainers)

from stepledger.format.spaces import is_variable_description, leaf_names
from stepledger.wording import settings_difference  # noqa: F401  (compare.settings_difference, as before)


class EnvDifference:
    """How one env's two streams differ.

    ``what`` is ``"fields"`` (values differ at an event), ``"kind"`` (a reset
    on one side, a step on the other), ``"length"`` (the streams agree but
    one ends first), ``"one_side"`` (the env is in one ledger only) or
    ``"overlap"`` (events that two trainer files hold, from ``event`` on:
    ``detail`` has their ``events`` and ``files``).
    ``episode`` and ``step`` locate the event on the env side; ``fields``
    lists the differing fields in report order; ``env_values`` and
    ``trainer_values`` map a field to its printed value where known.
    """

    def __init__(self, env: int, what: str, event: int | None = None, episode: int | None = None,
                 step: int | None = None, fields: Iterable[str] = (), env_values: dict[str, Any] | None = None,
                 trainer_values: dict[str, Any] | None = None, env_events: int | None = None,
                 trainer_events: int | None = None, side: str | None = None, counts: dict[str, Any] | None = None,
                 detail: dict[str, Any] | None = None) -> None:
        self.env, self.what, self.event = env, what, event
        self.episode, self.step, self.fields = episode, step, tuple(fields)
        self.env_values: dict[str, Any] = env_values or {}
        self.trainer_values: dict[str, Any] = trainer_values or {}
        self.env_events, self.trainer_events = env_events, trainer_events
        self.side, self.counts = side, counts
        self.detail: dict[str, Any] = detail or {}
        # field -> (env leaves, trainer leaves, leaf names), where values were kept
        self.raw: dict[str, tuple[list[np.ndarray], list[np.ndarray], list[str]]] = {}
        # with count_all: where each field's differences fall (stepledger.wording.pattern)
        self.patterns: list[str] = []
        # with count_all: field -> differing events in each of SPREAD_BINS equal parts of the shared events,
        # from the first on (what report/html.py draws)
        self.spread: dict[str, list[int]] = {}
        self.trainer_file: str | None = None  # the trainer file that holds this env's stream, if any
        # a multi-agent env ledger's possible_agents: the stream is an agent of an env copy
        self.agents: list[str] | None = None
        # (the env's end flag, steps the trainer got after it): an end the trainer missed
        self.untold: tuple[str, int] | None = None
        # the env's next-step reset, recorded by the trainer as a step: a reset step trained on as a transition
        self.reset_trained = False

    def line(self) -> str:
        """The report's line for this env."""
        if self.what == "one_side":
            return wording.one_side_line(self.env, self.side,
                                         self.env_events if self.side == "env" else self.trainer_events, self.agents)
        if self.what == "length":
            return wording.length_line(self.env, self.episode, self.step, self.env_events, self.trainer_events,
                                       self.agents)
        if self.what == "overlap":
            (first, last), (before, name) = self.detail["events"], self.detail["files"]
            return wording.overlap_line(self.env, self.episode, self.step, first, last, before, name, self.agents)
        line = wording.difference_line(self.env, self.episode, self.step, self.fields, self.env_values,
                                       self.trainer_values, self.detail, self.agents)
        if self.untold is not None:
            line += "; " + wording.untold_end(self.env, self.agents, *self.untold)
        if self.reset_trained:
            line += "; " + wording.reset_step_trained(self.agents)
        return line

    def _json_values(self, values: dict[str, Any], side: int) -> dict[str, Any]:
        """The printed values as JSON values: numbers, booleans, lists of numbers; text where not numeric."""
        out: dict[str, Any] = {}
        for f, text in values.items():
            if f in ("terminated", "truncated"):
                out[f] = text == "True"
            elif f == "reward":
                try:
                    out[f] = float(text)  # the shortest digits that round-trip, as printed
                except ValueError:
                    out[f] = text  # "invalid"
            elif f in self.raw and _json_size(self.raw[f][side]) <= _JSON_VALUES_LIMIT:
                leaves, names = self.raw[f][side], self.raw[f][2]
                out[f] = (np.asarray(leaves[0]).tolist() if names == [""]
                          else {n: np.asarray(v).tolist() for n, v in zip(names, leaves)})
            else:
                out[f] = text
        return out

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"env": self.env, "type": self.what}
        if self.what in ("fields", "kind"):
            d.update(event=self.event, episode=self.episode, step=self.step, fields=list(self.fields),
                     env_values=self._json_values(self.env_values, 0),
                     trainer_values=self._json_values(self.trainer_values, 1))
            if self.detail:
                d["first_element"] = self.detail
        if self.what == "length":
            d.update(episode=self.episode, step=self.step)
        if self.what == "overlap":
            d.update(event=self.event, episode=self.episode, step=self.step, events=list(self.detail["events"]),
                     files=list(self.detail["files"]))
        if self.what == "one_side":
            d["side"] = self.side
        d["env_events"], d["trainer_events"] = self.env_events, self.trainer_events
        if self.counts is not None:
            d["counts"] = self.counts
        if self.patterns:
            d["patterns"] = list(self.patterns)
        if self.trainer_file is not None:
            d["trainer_file"] = self.trainer_file
        if self.untold is not None:
            d["untold_end"], d["steps_never_taken"] = self.untold
        if self.reset_trained:
            d["reset_step_trained"] = True
        if self.agents:
            d["env_copy"] = self.env // len(self.agents)
            d["agent"] = self.agents[self.env % len(self.agents)]
        d["line"] = self.line()
        return d


class Report(DifferenceReport):
    """The result of a comparison. Truthy when the two sides agree everywhere.

    ``differences`` holds one EnvDifference per differing env, in env order;
    ``envs`` every env index seen on either side; ``str(report)`` is the text
    report, one line per differing env, then ``N of M envs differ``.
    """

    differences: list[EnvDifference]

    def __init__(self, envs: list[int], differences: list[EnvDifference], partial: dict[str, bool],
                 values_hint: bool, count_all: bool, notes: Iterable[str] = (), agent_streams: bool = False) -> None:
        self.envs = envs
        self.agent_streams = agent_streams  # the streams are agents of multi-agent env copies, not envs
        self.differences = differences
        self.partial = partial  # {"env": bool, "trainer": bool}
        self.values_hint = values_hint
        self.count_all = count_all
        self.hints: list[str] = []  # lines that name a likely cause (stepledger.wording), after the notes
        # Lines that are not differences: streams that end at different points in a run that
        # did not end cleanly, ledgers of other runs left out, ledgers still being written.
        self.notes = list(notes)
        self.trainer_files: list[str] = []  # the names of the trainer files compared
        # (file name, why) of files in the env directory named like env ledgers that could not be read as one:
        # not compared (their lines are among the notes); the command exits 3 where nothing else differs
        self.unread: list[tuple[str, str]] = []
        self.agents: list[str] | None = None  # with agent streams: the env ledgers' possible_agents
        self.recorder: str | None = None  # with agent streams: the env-side class hints name (agent_recorder)

    @property
    def complete(self) -> bool:
        """True when every file named like an env ledger was read and compared."""
        return not self.unread

    def by_env(self) -> dict[int, EnvDifference]:
        """The differences by env index."""
        return {d.env: d for d in self.differences}

    def lines(self) -> list[str]:
        out = [d.line() for d in self.differences]
        if self.count_all:
            for d in self.differences:
                if d.counts:
                    out.append(wording.counts_line(d.env, d.counts, d.agents))
                    out += ["%s: %s" % (wording.stream_name(d.env, d.agents), text) for text in d.patterns]
        out.append(wording.envs_differ(len(self.differences), len(self.envs), self.agent_streams))
        agents = wording.agents_differ(self.differences)
        if agents:
            out.append(agents)
        out.extend(self.notes)
        if self.values_hint:
            out.append(wording.VALUES_HINT)
        out += self.hints
        return out

    def __repr__(self) -> str:
        return "<Report ok=%s: %s>" % (self.ok, wording.envs_differ(len(self.differences), len(self.envs),
                                                                   self.agent_streams))

    def to_html(self, title: str | None = None) -> str:
        """The report as one self-contained HTML page (stepledger.report.html)."""
        from stepledger.report.html import to_html
        return to_html(self, title)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "envs": list(self.envs), "n_differ": len(self.differences),
                "differences": [d.to_dict() for d in self.differences], "partial": self.partial,
                "values_hint": self.values_hint, "hints": list(self.hints), "notes": list(self.notes),
                "trainer_files": list(self.trainer_files), "complete": self.complete,
                "unread": [{"file": name, "why": why} for name, why in self.unread]}



_JSON_VALUES_LIMIT = 4096  # elements; a larger kept value appears in JSON as its shortened text


def _json_size(leaves: Iterable[Any]) -> int:
    return sum(int(np.asarray(v).size) for v in leaves)


# ---------------------------------------------------------------- settings

def check_comparable(env_meta: Meta, trainer_meta: Meta, env_path: LedgerPath, trainer_path: LedgerPath) -> None:
    """Refuse (LedgerError) when the two ledgers cannot be compared."""
    if env_meta.get(S.META_SIDE) == "trainer" and trainer_meta.get(S.META_SIDE) == "env":
        raise LedgerError(wording.wrong_order(env_path, trainer_path))
    if env_meta.get(S.META_SIDE) != "env":
        raise LedgerError("%s: not an env-side ledger (side %r)" % (env_path, env_meta.get(S.META_SIDE)))
    if trainer_meta.get(S.META_SIDE) != "trainer":
        raise LedgerError("%s: not a trainer-side ledger (side %r)" % (trainer_path, trainer_meta.get(S.META_SIDE)))
    e_version, t_version = env_meta.get(S.META_FORMAT_VERSION), trainer_meta.get(S.META_FORMAT_VERSION)
    if _digest_format(e_version) != _digest_format(t_version):
        raise LedgerError("the two sides use different format versions (env %s, trainer %s)" % (e_version, t_version))
    msg = settings_difference(env_meta, trainer_meta)
    if msg:
        raise SettingsError(msg)


def _digest_format(version: Any) -> Any:
    """Versions whose events compare: 1 and 2 differ only in meta keys that say which run a file is of."""
    return 1 if version in (1, 2) else version


# ---------------------------------------------------------------- runs and how they ended

# Clocks of two machines differ a little: times closer than this are taken to overlap.
CLOCK_SLACK = 2.0


def other_run(env_meta: Meta, trainer_meta: Meta) -> str | None:
    """Why an env ledger is not of the trainer ledger's run, or None if it is (or cannot be told).

    Both carry a run id when the trainer side could reach the env side (through
    the vector env's set_attr, or SB3's env_method): they must be equal. Where
    the env side never heard from the trainer (a bridge, another machine), the
    two recordings must overlap in time.
    """
    er, tr = env_meta.get(S.META_RUN), trainer_meta.get(S.META_RUN)
    if er and tr:
        if er == tr:
            return None
        return wording.other_run_id(er, env_meta.get(S.META_UPDATED), tr)
    e_started: Any = env_meta.get(S.META_STARTED)  # times, once checked below
    e_updated: Any = env_meta.get(S.META_UPDATED)
    t_started: Any = trainer_meta.get(S.META_STARTED)
    t_updated: Any = trainer_meta.get(S.META_UPDATED)
    if not all(isinstance(t, (int, float)) for t in (e_started, e_updated, t_started, t_updated)):
        return None  # format version 1: no times to go by
    if e_updated < t_started - CLOCK_SLACK:
        return wording.other_run_before(e_updated, t_started)
    if trainer_meta.get(S.META_STATE) != S.STATE_OPEN and e_started > t_updated + CLOCK_SLACK:
        return wording.other_run_after(e_started, t_updated)
    return None


def _closed(meta: Meta) -> bool:
    """Closed cleanly: close() after a run no exception interrupted. Version 1 files count as closed."""
    return meta.get(S.META_STATE, S.STATE_CLOSED) == S.STATE_CLOSED


def _writer_alive(meta: Meta) -> bool | None:
    pid, start = meta.get(S.META_PID), meta.get(S.META_PID_START)
    if meta.get(S.META_HOST) != processes.HOST or not isinstance(pid, int):
        return None  # another machine: cannot tell
    return processes.running(pid, start)


def how_it_ended(meta: Meta, trainers: Sequence[Meta] = ()) -> str | None:
    """How a ledger's recording had ended when its file was written, in words; None if closed cleanly.

    An env ledger written on SIGTERM whose process's parent then was the writer of one of ``trainers`` (the
    trainer ledgers' metas): said as the trainer's process ending its vector env's workers (docs/ENDINGS.md)."""
    state = meta.get(S.META_STATE, S.STATE_CLOSED)
    if meta.get(S.META_REBOOTED):
        return wording.rebooted(meta[S.META_REBOOTED])
    if state == S.STATE_OPEN:
        alive = _writer_alive(meta)
        if alive is False and meta.get(S.META_MAPPED):
            return wording.died_whole(meta[S.META_MAPPED], bool(meta.get(S.META_KEEP_VALUES)))
        return wording.still_open(alive)
    if state == S.STATE_SIGNAL:
        for trainer in trainers:
            if (meta.get(S.META_HOST) == trainer.get(S.META_HOST) and isinstance(meta.get(S.META_PARENT_PID), int)
                    and meta.get(S.META_PARENT_PID) == trainer.get(S.META_PID)
                    and meta.get(S.META_PARENT_START) == trainer.get(S.META_PID_START)
                    and (trainer.get(S.META_INTERRUPTED_BY) in (None, "KeyboardInterrupt")
                         or _after(meta.get(S.META_UPDATED), trainer.get(S.META_UPDATED)))):
                # the trainer's process ended its workers. A worker killed from outside mid-run makes the
                # trainer's next step fail (another exception) after the worker wrote: said as a SIGTERM.
                return wording.ended_by_trainer(trainer.get(S.META_STATE, S.STATE_CLOSED),
                                                trainer.get(S.META_INTERRUPTED_BY), meta.get(S.META_PARENT_PID))
    return wording.ended(state, meta.get(S.META_INTERRUPTED_BY))


def _ledger_note(name: str, meta: Meta, events: int) -> str | None:
    """One line for a ledger that was not closed cleanly: how it ended, when it was last written, how much."""
    ended = how_it_ended(meta)
    if ended is None:
        return None
    return wording.ledger_note(name, ended, meta.get(S.META_UPDATED), events)


def _agents_of(stream: Stream) -> list[str] | None:
    """The agents of a multi-agent env ledger's streams (its file's possible_agents), or None."""
    agents = stream.meta.get(S.META_POSSIBLE_AGENTS)
    return agents if isinstance(agents, list) and agents else None


def _after(t: Any, other: Any) -> bool:
    """Unix time ``t`` is not before ``other`` (as a meta holds them, to the millisecond)."""
    return isinstance(t, (int, float)) and isinstance(other, (int, float)) and t >= other


def _env_notes(env_ledger: Ledger, env_dir: LedgerPath, trainers: Sequence[Meta] = ()) -> list[str]:
    """How the env ledgers ended, grouped: one line per way of ending, naming the files."""
    groups: dict[str, set[int]] = {}
    for idx, stream in env_ledger.streams.items():
        ended = how_it_ended(stream.meta, trainers)
        if ended is not None:
            agents = _agents_of(stream)  # a multi-agent copy's file holds a stream per agent
            groups.setdefault(ended, set()).add(idx // len(agents) if agents else idx)
    died = []
    for idx, stream in env_ledger.streams.items():  # a stream's own entry (a file's meta holds its streams')
        entry = stream.meta.get(S.META_DIED, {}).get(str(idx))
        if entry is not None:
            died.append(wording.died_during(idx, entry))
    return [wording.env_files_ended(env_dir, sorted(files), ended) for ended, files in sorted(groups.items())] + died


def _ends_note(env_id: int, es: Stream, ts: Stream) -> str:
    """The line for streams that agree as far as both go, in a run that did not end cleanly."""
    n_env, n_tr = len(es), len(ts)
    if n_env < n_tr:
        which, gap = "env", n_tr - n_env
    else:
        which, gap = "trainer", n_env - n_tr
    why = [(side, how_it_ended(meta, [ts.meta])) for side, meta in (("env", es.meta), ("trainer", ts.meta))]
    return wording.ends_apart(env_id, which, gap, [(side, ended) for side, ended in why if ended is not None],
                              min(n_env, n_tr), _agents_of(es))


class EnvWork(NamedTuple):
    """One env to compare: its two streams (None where a side has none), the first overlap of its trainer
    slices (read.stitch), and whether its env ledger is another run's or could not be read."""
    env: int
    env_stream: Stream | None
    trainer_stream: Stream | None
    overlap: Overlap | None
    other_run: bool


class EnvOutcome(NamedTuple):
    """What comparing one env gave: its difference (or None), lines for the notes, whether it was left
    uncompared, whether a value that differs was not kept (the values hint), and how many of the env's
    observations the library withheld from the trainer (compared as the env's: _take_withheld)."""
    difference: EnvDifference | None
    notes: list[str]
    uncompared: bool = False
    values_hint: bool = False
    withheld: int = 0


def compare_env(work: EnvWork, count_all: bool, meta: Meta) -> EnvOutcome:
    """Compare one env's two streams: the one function every way of running compare uses (in this process,
    in worker processes, as Ray tasks; stepledger.report.parallel). ``meta`` is the env side's."""
    e, es, ts, overlap, other_run = work
    if es is None and ts is not None and (other_run or how_it_ended(ts.meta) == wording.IN_PROGRESS):
        # Not compared, and not a difference: its env ledger is another run's (the line on skipped
        # files says so), or the run goes on and its env ledger may not have written anything yet
        # (the compare after the run, or a later one, tells)
        return EnvOutcome(None, [] if other_run else [wording.no_env_ledger_yet(e, len(ts))], uncompared=True)
    if es is None or ts is None:
        return EnvOutcome(EnvDifference(e, "one_side", side="env" if ts is None else "trainer",
                                        env_events=len(es) if es else 0, trainer_events=len(ts) if ts else 0), [])
    held: list[int] = []
    first, counts, position = _compare_stream(es, ts, count_all, held)
    withheld = sum(held)
    notes: list[str] = []
    hint = False
    if overlap is not None and 0 <= first < overlap[0]:
        notes.append(wording.slices_do_not_tile(e, *overlap, False, agents=_agents_of(es) if es else None))
        overlap = None
    if overlap is not None:
        # events two learners got: the stitched stream holds them once, in step with the env's
        # (read.stitch); the difference is at the first of them
        o = overlap[0]
        d = EnvDifference(e, "overlap", o, *_position_of(es if o < len(es) else ts, o),
                          detail={"events": overlap[:2], "files": overlap[2:]})
    elif first >= 0:
        assert position is not None  # the first difference's position: _compare_stream gives it
        d = _difference_at(e, es, ts, first, position, meta)
        d.untold = _untold_end(es, ts, first)
        # values not shown: the hint to keep them, unless both sides did (read from a mapped part: said in a note)
        hint = any(f in ("obs", "action") and f not in d.env_values for f in d.fields) and not (
            es.meta.get(S.META_KEEP_VALUES) and ts.meta.get(S.META_KEEP_VALUES))
    elif len(es) != len(ts):
        if not (_closed(es.meta) and _closed(ts.meta)):
            # the run ended badly: not a boundary fault
            return EnvOutcome(None, notes + [_ends_note(e, es, ts)], withheld=withheld)
        shared = min(len(es), len(ts))
        pos = position if shared and position is not None else (None, None)
        d = EnvDifference(e, "length", episode=pos[0], step=pos[1])
    else:
        return EnvOutcome(None, notes, withheld=withheld)
    where = counts.pop("where", None) if counts is not None else None
    if where is not None and d.what == "fields":
        d.patterns = where.patterns(counts, d.episode, d.step)
        d.spread = where.spread()
    d.env_events, d.trainer_events, d.counts = len(es), len(ts), counts
    return EnvOutcome(d, notes, values_hint=hint, withheld=withheld)


# ---------------------------------------------------------------- values

def _first_element(env_leaves: Sequence[Any], tr_leaves: Sequence[Any], names: Sequence[str]) -> str | None:
    if len(env_leaves) != len(tr_leaves):
        return None
    for name, a, b in zip(names, env_leaves, tr_leaves):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return None  # the values' texts give their shapes
        diff = np.argwhere(~((a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else (a == b)))
        if diff.size:
            idx = "[" + ", ".join(str(int(x)) for x in diff[0]) + "]" if a.ndim else ""
            return (name + idx) or "[]"
    return None


# ---------------------------------------------------------------- search

def _read_rows(stream: Stream, names: Sequence[str], start: int, stop: int) -> Columns:
    """Rows [start, stop) of a stream's columns, across its pieces."""
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    pos = 0
    for p in stream.pieces:
        n = p.stop - p.start
        a, b = max(start, pos), min(stop, pos + n)
        if a < b:
            for name in names:
                parts[name].append(p.lf.source(name).read(p.start + a - pos, p.start + b - pos))
        pos += n
        if pos >= stop:
            break
    return {n: (v[0] if len(v) == 1 else np.concatenate(v)) for n, v in parts.items()}


def _take_withheld(a: Columns, b: Columns) -> int:
    """Where the trainer side recorded an observation as withheld (the library never gave it, as it says it
    does: TorchRL's auto_reset and compact_obs), compare the env's in its place; how many there were."""
    mask = np.asarray(b["h_obs"]) == core.WITHHELD_DIGEST
    k = int(np.count_nonzero(mask))
    if k:
        b["h_obs"] = np.where(mask, a["h_obs"], b["h_obs"])
    return k


def _compare_stream(env_stream: Stream, tr_stream: Stream, count_all: bool, withheld: list[int] | None = None
                    ) -> tuple[int, dict[str, Any] | None, tuple[int, int] | None]:
    """First differing event index (or -1), counts per field if asked, and env positions; the number of
    withheld observations compared is appended to ``withheld``."""
    n = min(len(env_stream), len(tr_stream))
    first = -1
    counts: dict[str, Any] | None = {f: 0 for f in S.FIELDS} if count_all else None
    carry = (-1, 0)
    position: tuple[int, int] | None = None
    where: _Where | None = None
    for start in range(0, n, CHUNK):
        stop = min(start + CHUNK, n)
        a = _read_rows(env_stream, S.EVENT_COLUMN_NAMES, start, stop)
        b = _read_rows(tr_stream, S.EVENT_COLUMN_NAMES, start, stop)
        held = _take_withheld(a, b)
        if withheld is not None and held:
            withheld.append(held)
        if first < 0:
            i = core.first_difference(a, b)
            if i >= 0:
                first = start + i
                from stepledger.format.ledgerfile import positions
                ep, st, _ = positions(a["kind"][: i + 1], carry)
                position = (int(ep[-1]), int(st[-1]))
            else:
                carry = _advance(a["kind"], carry)
        if counts is not None and first >= 0:
            lo = max(first - start, 0)
            for f in S.FIELDS:
                col = S.FIELD_COLUMNS[f]
                counts[f] += int(np.count_nonzero(np.asarray(a[col][lo:]) != np.asarray(b[col][lo:])))
            where = where or _Where(n)
            where.add(a, b, lo, start)
        if first >= 0 and not count_all:
            break
    if first < 0 and n:
        position = carry  # the position of the last shared event
    if counts is not None:
        counts["where"] = where
    return first, counts, position


def _position_of(stream: Stream, index: int) -> tuple[int, int]:
    """(episode, step) of event ``index`` of a stream, read chunk by chunk."""
    carry = (-1, 0)
    for start in range(0, index + 1, CHUNK):
        _, _, carry = positions(_read_rows(stream, ("kind",), start, min(start + CHUNK, index + 1))["kind"], carry)
    return carry


def _advance(kind: np.ndarray, carry: tuple[int, int]) -> tuple[int, int]:
    resets = np.flatnonzero(np.asarray(kind) == S.KIND_RESET)
    n = len(kind)
    if resets.size:
        return (carry[0] + int(resets.size), n - 1 - int(resets[-1]))
    return (carry[0], carry[1] + n)


_PEEK = 64  # trainer events looked at after an end the trainer was not told of


def _untold_end(env_stream: Stream, tr_stream: Stream, index: int) -> tuple[str, int] | None:
    """At a step where the env ended its episode and the trainer was told neither flag, the episode's
    next event on the env side being a reset or none: (the env's flag, how many steps the trainer then
    received that the env never took, up to _PEEK). None for any other difference."""
    names = ("kind", "terminated", "truncated")
    a = _read_rows(env_stream, names, index, index + 2)
    b = _read_rows(tr_stream, names, index, index + 1 + _PEEK)
    if a["kind"][0] != S.KIND_STEP or b["kind"][0] != S.KIND_STEP or b["terminated"][0] or b["truncated"][0]:
        return None
    flag = "terminated" if a["terminated"][0] else "truncated" if a["truncated"][0] else None
    if flag is None or (len(a["kind"]) > 1 and a["kind"][1] != S.KIND_RESET):
        return None
    extra = 0
    for k in range(1, len(b["kind"])):
        if b["kind"][k] != S.KIND_STEP:
            break
        extra += 1
        if b["terminated"][k] or b["truncated"][k]:
            break
    return flag, extra


def _difference_at(env_id: int, env_stream: Stream, tr_stream: Stream, index: int, position: tuple[int, int],
                   meta: Meta) -> EnvDifference:
    a = _read_rows(env_stream, S.EVENT_COLUMN_NAMES, index, index + 1)
    b = _read_rows(tr_stream, S.EVENT_COLUMN_NAMES, index, index + 1)
    row_a = {k: v[0] for k, v in a.items()}
    row_b = {k: v[0] for k, v in b.items()}
    episode, step = position
    ours = {f: row_a[S.FIELD_COLUMNS[f]] for f in S.FIELDS}
    theirs = {f: row_b[S.FIELD_COLUMNS[f]] for f in S.FIELDS}
    if ours["kind"] != theirs["kind"]:
        env_kind, tr_kind = wording.event_values(("kind",), ours, theirs, meta[S.META_REWARD_DTYPE])
        d = EnvDifference(env_id, "kind", index, episode, step, ("kind",), env_kind, tr_kind)
        # a next-step reset (the same observation) that the trainer took for a step: trained on as a transition
        d.reset_trained = bool(ours["kind"] == S.KIND_RESET and theirs["kind"] == S.KIND_STEP
                               and ours["obs"] == theirs["obs"])
        return d
    fields = [f for f in S.FIELDS[1:] if ours[f] != theirs[f]]
    env_values: dict[str, Any] = {}
    tr_values: dict[str, Any] = {}
    detail: dict[str, Any] = {}
    raw: dict[str, tuple[list[np.ndarray], list[np.ndarray], list[str]]] = {}
    for f in fields:
        col = S.FIELD_COLUMNS[f]
        if f not in ("obs", "action"):
            env_f, tr_f = wording.event_values((f,), ours, theirs, meta[S.META_REWARD_DTYPE])
            env_values.update(env_f), tr_values.update(tr_f)
        else:
            which = "obs" if f == "obs" else "act"
            space = meta[S.META_OBS_SPACE if f == "obs" else S.META_ACT_SPACE]
            names = leaf_names(space)
            shapes = [shape for _, shape in S.space_leaves(space)]
            va, vb = env_stream.value_rows(which, index), tr_stream.value_rows(which, index)
            ta, tb = wording.digest_text(row_a[col]), wording.digest_text(row_b[col])
            if va is not None and vb is not None or ta or tb:
                env_values[f] = ta or (wording.values_text(va, names, shapes, space) if va is not None else None)
                tr_values[f] = tb or (wording.values_text(vb, names, shapes, space) if vb is not None else None)
                if env_values[f] is None or tr_values[f] is None:
                    env_values.pop(f), tr_values.pop(f)
                elif not (ta or tb) and not is_variable_description(space) and va is not None and vb is not None:
                    where = _first_element(va, vb, names)
                    if where:
                        detail[f] = where
                    raw[f] = (va, vb, names)
    d = EnvDifference(env_id, "fields", index, episode, step, fields, env_values, tr_values, detail=detail)
    d.raw = raw
    return d


# ---------------------------------------------------------------- causes

SPREAD_BINS = 100  # parts of an env's shared events in EnvDifference.spread


class _Where:
    """With count_all: where each field's differences fall, from an env's first difference on, of ``n`` shared
    events: in words (``patterns``) and in SPREAD_BINS equal parts of the stream (``spread``)."""

    def __init__(self, n: int) -> None:
        self.totals = {"events": 0, "steps": 0, "ends": 0, "starts": 0}
        self.by_field = {f: {"at_steps": 0, "at_ends": 0, "at_starts": 0} for f in S.FIELDS}
        self._prev_kind: Any = None  # the kind of the event before the chunk
        self.n = n
        self.bins = {f: np.zeros(SPREAD_BINS, dtype=np.int64) for f in S.FIELDS}

    def add(self, a: Columns, b: Columns, lo: int, start: int) -> None:
        """Rows ``lo:`` of a chunk of both streams that begins at event ``start``."""
        kind = np.asarray(a["kind"])
        prev = np.empty_like(kind)
        prev[0] = S.KIND_STEP if self._prev_kind is None else self._prev_kind
        prev[1:] = kind[:-1]
        self._prev_kind = kind[-1]
        kind, prev = kind[lo:], prev[lo:]
        is_step = kind == S.KIND_STEP
        ends = is_step & (np.asarray(a["terminated"][lo:]) | np.asarray(a["truncated"][lo:]))
        starts = is_step & (prev == S.KIND_RESET)
        t = self.totals
        t["events"] += len(kind)
        t["steps"] += int(np.count_nonzero(is_step))
        t["ends"] += int(np.count_nonzero(ends))
        t["starts"] += int(np.count_nonzero(starts))
        for f in S.FIELDS:
            col = S.FIELD_COLUMNS[f]
            diff = np.asarray(a[col][lo:]) != np.asarray(b[col][lo:])
            c = self.by_field[f]
            c["at_steps"] += int(np.count_nonzero(diff & is_step))
            c["at_ends"] += int(np.count_nonzero(diff & ends))
            c["at_starts"] += int(np.count_nonzero(diff & starts))
            at = np.flatnonzero(diff)
            if at.size:
                self.bins[f] += np.bincount((at + start + lo) * SPREAD_BINS // self.n, minlength=SPREAD_BINS)

    def spread(self) -> dict[str, list[int]]:
        return {f: [int(x) for x in b] for f, b in self.bins.items() if b.any()}

    def patterns(self, counts: dict[str, Any], episode: int | None, step: int | None) -> list[str]:
        out = []
        for f in S.FIELDS:
            n = counts.get(f, 0)
            if n:
                out.append(wording.pattern(f, n, dict(self.totals, **self.by_field[f]), episode, step))
        return out


_MATCH_EVENTS = FIRST_EVENTS  # events compared when looking for an env file that matches another env's stream


def _prefix(stream: Stream) -> Columns | None:
    """The first events of a stream (at most _MATCH_EVENTS), read once for every pairing."""
    n = min(len(stream), _MATCH_EVENTS)
    return _read_rows(stream, S.EVENT_COLUMN_NAMES, 0, n) if n else None


def _prefixes_match(a: Columns | None, b: Columns | None) -> bool:
    if a is None or b is None:
        return False
    n = min(len(a["kind"]), len(b["kind"]))
    return core.first_difference({k: v[:n] for k, v in a.items()}, {k: v[:n] for k, v in b.items()}) < 0


class _PrefixIndex:
    """Streams' first events (``_prefix``), bucketed, so that finding the streams a prefix matches compares it with
    the few that could match, not with every stream (pairing stays linear in the number of envs).

    Two prefixes match when they agree on their first min(their lengths) events, so they agree on the first
    ``length`` events, the shortest prefix there is: the bucket's key is a digest of those. ``candidates(p)``
    are the streams of ``p``'s bucket, in the order they were given; ``matches(p)`` those that match it.
    """

    def __init__(self, prefixes: dict[int, Columns | None], others: Iterable[Columns | None] = ()) -> None:
        lengths = [len(p["kind"]) for p in list(prefixes.values()) + list(others) if p is not None]
        self.length = min(lengths) if lengths else 0
        self.prefixes = prefixes
        self.buckets: dict[bytes, list[int]] = {}
        for t, p in prefixes.items():
            if p is not None:
                self.buckets.setdefault(self._key(p), []).append(t)

    def _key(self, p: Columns) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for name in S.EVENT_COLUMN_NAMES:
            h.update(np.ascontiguousarray(p[name][: self.length]).tobytes())
        return h.digest()

    def matches(self, p: Columns | None) -> Iterator[int]:
        if p is None:
            return
        for t in self.buckets.get(self._key(p), ()):
            if _prefixes_match(p, self.prefixes[t]):
                yield t


def _index_hint(report: Report, env_ledger: Ledger, tr_ledger: Ledger) -> str | None:
    """A line when env files match other trainer envs' streams (index= wrong, swapped or duplicated), or None.

    Only envs that differ from their very first events, or that are on one
    side only, are looked at; a stream matches when its first events agree.
    """
    early = {d.env for d in report.differences
             if d.what == "one_side" or (d.what in ("fields", "kind") and d.event is not None and d.event <= 1)}
    env_side = [e for e in sorted(early) if e in env_ledger.streams]
    tr_side = [e for e in sorted(early) if e in tr_ledger.streams]
    if not env_side or not tr_side:
        return None
    env_prefix = {e: _prefix(env_ledger.streams[e]) for e in env_side}
    index = _PrefixIndex({t: _prefix(tr_ledger.streams[t]) for t in tr_side}, env_prefix.values())
    pairs: list[tuple[int, int]] = []
    taken: set[int] = set()
    for e in env_side:
        for t in index.matches(env_prefix[e]):
            if t != e and t not in taken:
                pairs.append((e, t))
                taken.add(t)
                break
    if not pairs:
        return None
    agents = _agents_of(env_ledger.streams[pairs[0][0]])
    unmatched = [t for t in tr_side if t not in taken]  # suspects differ early from their own file, if any
    if agents:
        copies = _whole_copies(pairs, len(agents))
        if copies is None:
            # a multi-agent env side: the trainer's slots carry other (env copy, agent) pairs than SuperSuit's order
            return wording.slot_map_hint(sorted((t, e) for e, t in pairs), agents)
        # every agent of an env file matches the same agent of another env copy: the copy's index is wrong
        n = len(agents)
        lost = sorted({t // n for t in unmatched if all(t // n * n + k in unmatched for k in range(n))})
        duplicates = sorted({e for e, t in copies if e in lost and t * n not in env_ledger.streams})
        return wording.index_hint(copies, lost, duplicates, copies=report.recorder or True)
    # env-e.npz holds trainer env t's stream, trainer env e has no file of its own and there is no env-t.npz:
    # two envs were given index e and one file overwrote the other
    duplicates = sorted({e for e, t in pairs if e in unmatched and t not in env_ledger.streams})
    return wording.index_hint(pairs, unmatched, duplicates)


def _whole_copies(pairs: list[tuple[int, int]], n: int) -> list[tuple[int, int]] | None:
    """(env file's copy, trainer's copy) when the matching (env stream, trainer stream) ``pairs`` are whole env
    copies of ``n`` agents, each agent matching itself in one other copy; None otherwise."""
    to: dict[int, set[int]] = {}
    for e, t in pairs:
        if e % n != t % n:
            return None
        to.setdefault(e // n, set()).add(t // n)
    if any(len(ts) != 1 for ts in to.values()) or len(pairs) != n * len(to):
        return None
    return sorted((c, ts.pop()) for c, ts in to.items())


def _unindexed_notes(env_ledger: Ledger, tr_ledger: Ledger) -> list[str]:
    """A line for each env ledger recorded without an index, with the trainer stream its first events match:
    one of the trainer's envs that has no env ledger of its own, looked at first, else any."""
    lines: list[str] = []
    if not env_ledger.unindexed:
        return lines
    order = sorted(tr_ledger.streams, key=lambda t: (t in env_ledger.streams, t))
    index = _PrefixIndex({t: _prefix(tr_ledger.streams[t]) for t in order}, [u[3] for u in env_ledger.unindexed])
    for name, meta, events, first in env_ledger.unindexed:
        match = next(index.matches(first), None)
        position = meta.get(S.META_POSITION)
        lines.append(wording.unindexed_note(name, events, position if isinstance(position, int) else None, match))
    return lines


def _wrappers_found(tr_ledger: Ledger) -> list[str]:
    """The wrappers the trainer side found between the two ledgers when it was built (its meta)."""
    metas = [led.meta for _, led in getattr(tr_ledger, "named", ())] or [tr_ledger.meta]
    found: list[str] = []
    for meta in metas:
        for w in meta.get(S.META_WRAPPERS) or ():
            if w not in found:
                found.append(w)
    return found


def cause_hints(report: Report, env_ledger: Ledger, tr_ledger: Ledger) -> list[str]:
    """Hint lines that name the likely cause of a report's differences (worded in stepledger.wording)."""
    if report.ok:
        return []
    line = _index_hint(report, env_ledger, tr_ledger)
    if line:
        return [line]
    hints = []
    diffs = report.differences
    fields = [d for d in diffs if d.what == "fields"]
    if len(fields) == len(diffs) == len(report.envs) and all(
            d.episode == 0 and d.step is not None and d.step <= 1 for d in fields):
        common = [f for f in S.FIELDS if all(f in d.fields for d in fields)]
        if common:
            hints.append(wording.every_env_hint(common[0], len(report.envs), report.agent_streams,
                                                _wrappers_found(tr_ledger), report.recorder))
    if fields and len(fields) == len(diffs) and all(
            d.fields == ("truncated",) and d.env_values.get("truncated") == "False"
            and d.trainer_values.get("truncated") == "True" for d in fields):
        hints.append(wording.agent_time_limit_hint(report.recorder) if report.agent_streams
                     else wording.TIME_LIMIT_HINT)
    if fields and len(fields) == len(diffs) and all(
            d.fields == ("terminated", "truncated") and d.env_values.get("truncated") == "True"
            and d.trainer_values.get("terminated") == "True" for d in fields):
        hints.append(wording.TRUNCATION_AS_TERMINATION_HINT)
    return hints


def _spec_text(spec: TrainerSpec) -> str:
    return ", ".join(str(x) for x in spec) if isinstance(spec, (list, tuple)) else str(spec)


def _names_a_directory(spec: TrainerSpec) -> bool:
    items: list[Any] = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    for p in items:
        p = storage.local_path(os.fspath(p))
        if storage.isdir(p) if storage.is_remote(p) else os.path.isdir(p):
            return True
    return False


def _span(meta: Meta) -> tuple[float, float] | None:
    """(began, last written) of a ledger's recording; still being written: until now. None without times."""
    began, written = meta.get(S.META_STARTED), meta.get(S.META_UPDATED)
    if not (isinstance(began, (int, float)) and isinstance(written, (int, float))):
        return None
    if meta.get(S.META_STATE) == S.STATE_OPEN and _writer_alive(meta):
        written = max(written, time.time())
    return began, written


def this_run(named: list[tuple[str, Ledger]]) -> tuple[list[tuple[str, Ledger]], list[str]]:
    """The trainer ledgers of the run that began last, and lines for those of earlier runs.

    Files that carry one run id are of one run (stepledger.rllib gives each of its
    learners' files its run's). Otherwise a file is a recording of its own (its own
    run id), and the files of one run are told by their times: recordings that
    overlap (within CLOCK_SLACK) are of one run. A file of an earlier run left in
    the directory (a run with more learners, before) is passed over with a line.
    """
    found = [_span(led.meta) for _, led in named]
    if len(named) == 1 or any(sp is None for sp in found):
        return named, []
    spans = [sp for sp in found if sp is not None]  # every one, as just checked
    units: dict[Any, list[int]] = {}  # the files of each run id
    for k, (_, led) in enumerate(named):
        units.setdefault(led.meta.get(S.META_RUN) or ("no run id", k), []).append(k)
    members = list(units.values())
    unit_spans = [(min(spans[k][0] for k in m), max(spans[k][1] for k in m)) for m in members]
    groups: list[list[int]] = []
    end: float | None = None
    for u in sorted(range(len(members)), key=lambda u: unit_spans[u][0]):
        if end is None or unit_spans[u][0] > end + CLOCK_SLACK:
            groups.append([])
            end = unit_spans[u][1]
        groups[-1].extend(members[u])
        end = max(end, unit_spans[u][1])
    groups = [sorted(g, key=lambda k: spans[k][0]) for g in groups]
    current = groups[-1]
    lines = [wording.earlier_trainer_run(named[k][0], wording.when(spans[k][1]), wording.when(spans[current[0]][0]),
                                         named[current[0]][0]) for g in groups[:-1] for k in g]
    return [named[k] for k in sorted(current)], lines


def _check_trainers(named: list[tuple[str, Ledger]]) -> None:
    """Refuse trainer files of one run that record differently, or that share an env."""
    first_name, first = named[0][0], named[0][1].meta
    for name, led in named[1:]:
        meta = led.meta
        version, first_version = meta.get(S.META_FORMAT_VERSION), first.get(S.META_FORMAT_VERSION)
        if _digest_format(version) != _digest_format(first_version):
            raise LedgerError(wording.different_trainer_settings(name, first_name, "format version", version,
                                                                 first_version))
        found = wording.differing_setting(meta, first)
        if found is not None:
            raise LedgerError(wording.different_trainer_settings(name, first_name, *found))
    holders: dict[int, list[str]] = {}
    sliced: dict[int, list[bool]] = {}
    for name, led in named:
        for idx, stream in led.streams.items():
            if len(stream):  # a stream with no events is not the env's record
                holders.setdefault(idx, []).append(name)
                sliced.setdefault(idx, []).append(fragments_of(name, stream) is not None)
    # an env may be in several files where each holds slices of it, with their offsets (read.stitch)
    clash = sorted(i for i, names in holders.items() if len(names) > 1 and not all(sliced[i]))
    if clash:
        raise LedgerError(wording.env_in_several_trainer_files(clash[0], holders[clash[0]], len(clash) - 1))


def read_trainer_side(trainer_files: TrainerSpec) -> tuple[MergedLedger, list[str]]:
    """The trainer side of a comparison: one trainer ledger, or several read as one (MergedLedger).

    Returns (ledger, lines about files passed over). LedgerError if they cannot be compared together.
    """
    named, passed = read_trainers(trainer_files)
    try:
        named_now, earlier = this_run(named)
        for name, led in named:
            if all(led is not other for _, other in named_now):
                led.close()
        _check_trainers(named_now)
        merged = MergedLedger(_spec_text(trainer_files), named_now)
    except BaseException:
        for _, led in named:
            led.close()
        raise
    return merged, passed + earlier


def compare(env_dir: LedgerPath, trainer_file: TrainerSpec, count_all: bool = False,
            progress: Callable[[int, int], Any] | None = None, jobs: int | None = None,
            ray: str | bool | None = None) -> Report:
    """Compare the env-side ledgers in ``env_dir`` with the trainer side ``trainer_file``.

    ``trainer_file`` is a trainer ledger, or several: a list of them, a glob
    (``"ledger/trainer-*.npz"``), or a directory holding them (also the env
    directory itself). Each env must be in exactly one of them (a stream with
    no events does not count). Trainer files of an earlier run among them are
    left out, with a line each.

    Returns a Report (truthy when the two agree). Raises LedgerError when they
    cannot be compared: a missing or unreadable ledger, the two sides given
    in the wrong order, or different reward dtypes, spaces or format versions,
    or ledgers of two different runs, or an env in two trainer files.
    With ``count_all``, also counts per field the events that differ after
    the first, which tells a one-off fault from a systematic one. Either
    argument may be an fsspec URL (``s3://...``), read from a local copy.
    ``progress(done, total)``, if given, is called as the envs are compared.

    ``jobs`` worker processes compare the envs (default: the cores this process may run on; a compare
    too small to gain from workers runs in this process); ``ray`` runs them as Ray tasks instead, on the
    cluster at that address (``True``: the cluster this process has joined, else ``"auto"``), each task
    reading its ledgers from the path or URL itself: ``jobs`` tasks, or one per CPU of the cluster. The report is the same, byte for byte, however it
    was run. A worker or task that dies raises ``WorkerLost`` (a LedgerError): no report.

    ``env_dir`` may also be one env ledger file: the envs it holds are compared, and only they (a line
    names the trainer side's others). A file of ``env_dir`` named like an env ledger that cannot be read
    as one (a stray file, a damaged one) is left out with a line, its env not compared, and listed in
    ``report.unread`` (``report.complete`` is then False; the command exits 3 where nothing differs).
    Env ledgers of another run in ``env_dir`` are left out, with a line each.
    Where a run did not end cleanly (Ctrl-C, a signal, no close(), or still
    going), streams that agree as far as both go but end at different points
    get a line of their own and are not a difference.
    """
    parallel.check_jobs(jobs)  # bad input is refused before anything is read
    # On Ray, the tasks read the ledgers' columns: this process fetches of a URL's ledgers what it reads
    on_demand = ON_DEMAND.set(ON_DEMAND.get() or parallel.on_ray(ray))
    try:
        return _compare(env_dir, trainer_file, count_all, progress, jobs, ray)
    finally:
        ON_DEMAND.reset(on_demand)


def _compare(env_dir: LedgerPath, trainer_file: TrainerSpec, count_all: bool,
             progress: Callable[[int, int], Any] | None, jobs: int | None, ray: str | bool | None) -> Report:
    try:
        tr_ledger, tr_lines = read_trainer_side(trainer_file)
    except LedgerError:
        with read(env_dir) as env_first:  # the env side's error, if it has one, comes first, as the arguments do
            if env_first.side == "trainer":
                raise LedgerError(wording.wrong_order(env_dir, _spec_text(trainer_file))) from None
        raise
    try:
        def accept(meta: Meta, name: str) -> str | None:
            # the trainer files holding the file's envs (a batch's env-N-M.npz holds several), or all of them
            idxs = env_indices_of(name)
            holders: set[str] | None = None
            if idxs is not None and all(i in tr_ledger.source for i in idxs):
                holders = {n for i in idxs for n in tr_ledger.holders[i]}
            metas = [led.meta for n, led in tr_ledger.named if holders is None or n in holders]
            reasons = [other_run(meta, m) for m in metas]
            return None if any(r is None for r in reasons) else reasons[0]
        runs = {led.meta.get(S.META_RUN) for _, led in tr_ledger.named} - {None}

        def linked(meta: Meta, idx: int) -> bool:  # the trainer side told this env ledger it is env idx of its run
            return meta.get(S.META_RUN) in runs and meta.get(S.META_POSITION) == idx
        unread: list[tuple[str, str]] = []  # files named like env ledgers that are not: named, and the rest compared
        env_ledger = read_ledger(env_dir, accept, unread, linked, parallel.opening_threads(jobs, ray))
    except LedgerError:
        tr_ledger.close()
        raise
    trainer_file_given, trainer_file = trainer_file, _spec_text(trainer_file)
    try:
        if not env_ledger.streams and env_ledger.skipped:
            name, reason = env_ledger.skipped[0]
            raise LedgerError("%s and the env ledgers in %s are from different runs (%s %s): nothing to compare"
                              % (trainer_file, env_dir, name, reason))
        if env_ledger.side == "trainer" and _names_a_directory(trainer_file_given):
            # a trainer file, then a directory that holds trainer files too: the env directory comes first
            raise LedgerError(wording.wrong_order(env_dir, trainer_file))
        check_comparable(env_ledger.meta, tr_ledger.meta, env_dir, trainer_file)
        meta = env_ledger.meta
        # an env ledger file given in the directory's place: the envs it holds are compared, and only they
        alone = None if _names_a_directory(env_dir) else sorted(env_ledger.streams)
        notes = [wording.not_compared(name, reason) for name, reason in env_ledger.skipped]
        recorded = {i for i, st in tr_ledger.streams.items() if len(st)}  # envs the trainer side has events of
        notes += [wording.not_read(name, why, bool(set(env_indices_of(name) or ()) & recorded))
                  for name, why in unread]
        # trainer streams no env ledger holds: beside a second recording of one index, two of the trainer side's
        # envs were most likely given that index (the trainer side told neither its position)
        missing = recorded - set(env_ledger.streams)
        for name, idx, dup_meta in env_ledger.duplicates:
            if (dup_meta.get(S.META_RUN) in runs and dup_meta.get(S.META_POSITION) is not None) or (
                    missing and dup_meta.get(S.META_COPY) is None and dup_meta.get(S.META_POSITION) is None):
                notes.append(wording.recorded_twice(name, idx))  # two of the trainer side's envs given one index
            else:
                notes.append(wording.recorded_copy(name, idx, env_ledger.duplicate_events.get(name, 0),
                                                   dup_meta.get(S.META_COPY)))
        notes += _unindexed_notes(env_ledger, tr_ledger)
        for idx, stream in env_ledger.streams.items():
            position = stream.meta.get(S.META_POSITION)
            if isinstance(position, int) and position != idx:
                notes.append(wording.told_position(idx, position))
        # a trainer stream that never got an event, with no env ledger either: nothing was recorded of that
        # env on either side (a trainer ledger sized for more envs than it saw, as stepledger.rllib's is)
        envs = sorted(set(env_ledger.streams) | recorded)
        if alone is not None:
            others = [e for e in envs if e not in env_ledger.streams]
            if others:
                notes.append(wording.env_file_alone(env_dir, alone, others, _agents_of(env_ledger.streams[alone[0]])
                                                    if alone else None))
            envs = alone
        overlaps: dict[int, Overlap] = getattr(tr_ledger, "overlaps", {})
        differences: list[EnvDifference] = []
        hint = False
        # envs whose env ledger is another run's, or cannot be read: not compared, and not a difference
        other_runs = {i for name, _ in env_ledger.skipped + unread for i in env_indices_of(name) or ()}
        uncompared: set[int] = set()
        withheld: dict[int, int] = {}  # per env, the observations the library withheld from the trainer
        work = [EnvWork(e, env_ledger.streams.get(e), tr_ledger.streams.get(e), overlaps.get(e), e in other_runs)
                for e in envs]
        for e, outcome in zip(envs, parallel.compare_envs(compare_env, work, count_all, meta, jobs, ray,
                                                           progress, (env_ledger, tr_ledger))):
            notes += outcome.notes
            hint |= outcome.values_hint
            if outcome.withheld:
                withheld[e] = outcome.withheld
            if outcome.uncompared:
                uncompared.add(e)
            if outcome.difference is not None:
                differences.append(outcome.difference)
        if withheld:
            notes.append(wording.withheld_obs(withheld))
        envs = [e for e in envs if e not in uncompared]
        if differences:  # a difference is reported from files whose every checksum holds, never from damage
            differing = [d.env for d in differences]
            env_ledger.verify(differing)
            tr_ledger.verify(differing)
        tr_notes = [_ledger_note(name, led.meta, led.n_events()) for name, led in tr_ledger.named]
        tr_lines += [wording.slices_do_not_tile(*gap, True, agents=_agents_of(env_ledger.streams[gap[0]])
                                                if gap[0] in env_ledger.streams else None)
                     for gap in tr_ledger.gaps]
        notes += tr_lines + [n for n in tr_notes if n] + _env_notes(
            env_ledger, env_dir if alone is None else os.path.dirname(os.fspath(env_dir)) or ".",
            [led.meta for _, led in tr_ledger.named])
        partial = {"env": env_ledger.partial, "trainer": tr_ledger.partial}
        on_env_side = [env_ledger.streams[e] for e in envs if e in env_ledger.streams]
        agent_streams = bool(on_env_side) and all(_agents_of(s) for s in on_env_side)
        for d in differences:
            d.trainer_file = tr_ledger.source.get(d.env)
            if d.env in env_ledger.streams:
                d.agents = _agents_of(env_ledger.streams[d.env])
            elif agent_streams:  # a trainer slot no env file holds: an agent stream all the same
                d.agents = _agents_of(on_env_side[0])
        report = Report(envs, differences, partial, hint, count_all, notes, agent_streams)
        report.trainer_files = [name for name, _ in tr_ledger.named]
        report.unread = list(unread)
        report.agents = _agents_of(on_env_side[0]) if agent_streams else None
        report.recorder = wording.agent_recorder(on_env_side[0].meta) if agent_streams else None
        report.hints = cause_hints(report, env_ledger, tr_ledger)
        return report
    except LedgerError as exc:
        text = tr_ledger.rename(env_ledger.rename(str(exc)))  # a URL's local copy named by its URL
        if text != str(exc):
            raise LedgerError(text) from None
        raise
    finally:
        env_ledger.close()
        tr_ledger.close()
