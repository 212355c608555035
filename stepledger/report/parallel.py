"""How compare's envs are run: in this process, in worker processes on this machine, or as Ray tasks.

``compare`` reads both sides' files (their directories, metas and stream offsets, never a column), checks
that they can be compared, and hands this layer the envs (``compare.EnvWork``) with the one function that
compares an env (``compare.compare_env``). Each way of running calls that function on every env and gives
back its outcomes in env order, so the report is made from the same outcomes, in the same order, however
they were computed:

- in this process, one env after another: a compare too small to pay for starting workers
  (fewer than ``MIN_EVENTS_A_WORKER`` events for a second worker), or ``jobs=1``;
- in ``jobs`` worker processes (default: the cores this process may run on), each given a run of envs
  next to each other, balanced by their events, which it reads one env at a time, in bounded memory:
  forked, through the very files compare opened (their descriptors are inherited); spawned, from the
  files by name (a stream is sent as its files and rows, ``read.stream_ref``, each file with a
  fingerprint that tells whether it is still the one compare read);
- as Ray tasks on a cluster (``ray=ADDRESS``, or ``True`` for the cluster this process has joined, else
  ``"auto"``), one task per group of envs, each reading its ledgers from the shared path or the URL
  itself (a URL's files are fetched by the task, to its own temporary directory).

A worker that dies, or a task that is lost, ends the compare with ``WorkerLost``: the report is not whole,
so none is given. Ctrl-C, or any exception, ends every worker before it propagates.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import operator
import os
import signal
import sys
import tempfile
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from stepledger import wording
from stepledger.errors import LedgerError, WorkerLost, one_line
from stepledger.format import schema as S
from stepledger.format import ondemand, storage
from stepledger.format.ledgerfile import LedgerFile
from stepledger.report.read import Stream, StreamRef, open_stream, stream_ref

if TYPE_CHECKING:
    from stepledger.report.compare import EnvOutcome, EnvWork, Ledger, Meta

#: the per-env function: compare.compare_env(work, count_all, meta)
EnvFunction = Callable[["EnvWork", bool, "Meta"], "EnvOutcome"]
#: an env to compare as sent to a worker: (position in the env list, EnvWork with StreamRefs for Streams)
_Item = tuple[int, tuple[int, Any, Any, Any, bool]]

# Events compared (the shorter side of each env, summed) below which a second worker would cost more to
# start than it saves: one process compares about 8 million events a second on this project's machine.
MIN_EVENTS_A_WORKER = 2_000_000
_JOIN_TIMEOUT = 5.0  # seconds a worker is given to end once told to, before it is killed


def default_jobs() -> int:
    """The cores this process may run on (its CPU affinity), or the machine's where that is not known."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def check_jobs(jobs: Any) -> int:
    """``jobs`` as a number of workers (None: ``default_jobs()``); ValueError, in one line, if it is not one."""
    if jobs is None:
        return default_jobs()
    try:
        n = operator.index(jobs)  # an int, or a NumPy integer; not a float, a str, a bool
    except TypeError:
        n = 0
    if isinstance(jobs, bool) or n < 1:
        raise ValueError(wording.bad_jobs("jobs=%r" % (jobs,)))
    return n


def on_ray(ray: Any) -> bool:
    """Whether ``ray`` (compare's argument) asks for Ray tasks."""
    return ray is not None and ray is not False


def opening_threads(jobs: Any, ray: Any) -> int:
    """Threads that open the env ledgers (read.read_ledger): as many as there are local workers."""
    return 1 if on_ray(ray) else check_jobs(jobs)


def _events(work: EnvWork) -> int:
    es, ts = work.env_stream, work.trainer_stream
    return min(len(es), len(ts)) if es is not None and ts is not None else 0


def plan(work: Sequence[EnvWork], groups: int) -> list[list[int]]:
    """At most ``groups`` runs of env positions next to each other, balanced by their events (each worker
    then reads a trainer file forward, once): an env goes in the run where the middle of its events
    falls. Linear in the number of envs."""
    weights = [_events(w) + 1 for w in work]
    total = sum(weights)
    out: list[list[int]] = [[] for _ in range(groups)]
    before = 0
    for k, w in enumerate(weights):
        out[min(groups - 1, int((before + w / 2) * groups // total))].append(k)
        before += w
    return [run for run in out if run]


def compare_envs(fn: EnvFunction, work: Sequence[EnvWork], count_all: bool, meta: Meta, jobs: Any,
                 ray: Any, progress: Callable[[int, int], Any] | None,
                 ledgers: Sequence[Ledger]) -> list[EnvOutcome]:
    """``fn(w, count_all, meta)`` for every ``w`` of ``work``, in order, run as ``jobs`` and ``ray`` say
    (see the module's docstring). ``ledgers`` are the two sides read: a URL's local copy is named by its
    URL for Ray tasks."""
    in_map = [_mapped(w) for w in work]
    if any(in_map):
        # a stream read in part from a mapped part (a killed process's events, read/_MapPart) is in this
        # process's memory only: no other process can open it by name, so those envs are compared here (a
        # forked worker would have them, but a run's compare should not depend on the start method), and the
        # others as the rest of this function says; their outcomes go back in order
        mapped = [k for k, m in enumerate(in_map) if m]
        rest = [k for k, m in enumerate(in_map) if not m]
        total = len(work)
        outs = dict(zip(rest, compare_envs(fn, [work[k] for k in rest], count_all, meta, jobs, ray,
                                           _shifted(progress, 0, total), ledgers) if rest else []))
        outs.update(zip(mapped, _here(fn, [work[k] for k in mapped], count_all, meta,
                                      _shifted(progress, len(rest), total))))
        return [outs[k] for k in range(total)]
    if on_ray(ray):
        return _on_ray(fn, work, count_all, meta, ray, jobs, progress, ledgers)
    workers = min(check_jobs(jobs), max(1, sum(_events(w) for w in work) // MIN_EVENTS_A_WORKER),
                  max(1, sum(1 for w in work if _events(w))))
    if workers <= 1:
        return _here(fn, work, count_all, meta, progress)
    return _in_processes(fn, work, count_all, meta, workers, progress)


def _mapped(w: EnvWork) -> bool:
    """Whether a stream of ``w`` holds events read from a mapped part rather than a ledger file."""
    return any(not isinstance(p.lf, LedgerFile) for s in (w.env_stream, w.trainer_stream) if s is not None
               for p in s.pieces)


def _shifted(progress: Callable[[int, int], Any] | None, before: int,
             total: int) -> Callable[[int, int], Any] | None:
    """``progress`` of a part of the envs, ``before`` of the ``total`` done ahead of it."""
    if progress is None:
        return None
    return lambda done, _of: progress(before + done, total)


def _here(fn: EnvFunction, work: Sequence[EnvWork], count_all: bool, meta: Meta,
          progress: Callable[[int, int], Any] | None) -> list[EnvOutcome]:
    out = []
    for k, w in enumerate(work):
        if progress is not None:
            progress(k, len(work))
        out.append(fn(w, count_all, meta))
        if w.env_stream is not None:  # its files' read positions are not needed again: memory stays bounded
            for p in w.env_stream.pieces:
                p.lf.release()
    if progress is not None:
        progress(len(work), len(work))
    return out


def _fingerprint(lf: LedgerFile) -> tuple[int, int, Any]:
    """What tells a ledger file from the one written under its name after it (flush() and close() replace
    it): its size, its events and when its recording last wrote it."""
    assert lf.fd is not None
    return os.fstat(lf.fd).st_size, int(lf.offsets[-1]), lf.meta.get(S.META_UPDATED)


def _items(work: Sequence[EnvWork], positions: list[int], name: Callable[[str], str] = str) -> list[_Item]:
    """The envs at ``positions`` as another process re-opens them: each stream as its files and rows, each
    file with its fingerprint."""
    def ref(s: Stream | None) -> Any:
        return None if s is None else (stream_ref(s, name), [_fingerprint(p.lf) for p in s.pieces])
    return [(k, (work[k].env, ref(work[k].env_stream), ref(work[k].trainer_stream), work[k].overlap,
                 work[k].other_run)) for k in positions]


class _Changed(Exception):
    """A file a worker opened by its name is no longer the one compare read (a ledger still being written
    was replaced): the parent compares those envs itself, from the files it holds open."""


class _Files:
    """The ledger files a worker opens by name, by path; a URL's file is fetched first, to ``local``."""

    def __init__(self, local: str | None = None) -> None:
        self.open: dict[str, LedgerFile] = {}
        self.local = local
        self.trainer: set[str] = set()
        self.copies: dict[str, str] = {}  # URL -> its local copy
        self.on_demand: dict[str, ondemand.OnDemand] = {}  # URL -> its copy, filled as it is read

    def get(self, path: str, fingerprint: Any) -> LedgerFile:
        lf = self.open.get(path)
        if lf is None:
            where = path
            if storage.is_remote(path):
                assert self.local is not None
                where = os.path.join(self.local, "%d-%s" % (len(self.copies), path.rstrip("/").rsplit("/", 1)[-1]))
                size = storage.size(path)
                if size is not None:  # only the rows of this task's envs are fetched (format/ondemand.py)
                    copy = self.on_demand[path] = ondemand.OnDemand(path, where, size)
                    ondemand.prefetch([copy])
                self.copies[path] = where
            try:
                lf = LedgerFile(where, checked=True)  # compare opened it and checked its small members
            except LedgerError:
                raise _Changed(path) from None  # gone, or replaced by a file cut short: the parent reads it
            self.open[path] = lf
            if list(_fingerprint(lf)) != list(fingerprint):
                raise _Changed(path)
        return lf

    def stream(self, ref: Any) -> Stream:
        (index, pieces, meta), prints = ref
        opened = iter(prints)
        return open_stream((index, pieces, meta), lambda path: self.get(path, next(opened)))

    def work(self, item: tuple[int, Any, Any, Any, bool]) -> EnvWork:
        from stepledger.report.compare import EnvWork
        e, es, ts, overlap, other_run = item
        if ts is not None:
            self.trainer.update(path for path, _, _ in ts[0][1])
        return EnvWork(e, None if es is None else self.stream(es), None if ts is None else self.stream(ts),
                       overlap, other_run)

    def keep_only(self, item: tuple[int, Any, Any, Any, bool] | None) -> None:
        """Close the files the next env (``item``) does not read, but the trainer side's."""
        wanted = set(self.trainer)
        if item is not None:
            for ref in item[1:3]:
                if ref is not None:
                    wanted.update(path for path, _, _ in ref[0][1])
        for path in [p for p in self.open if p not in wanted]:
            self.open.pop(path).close()
            self._drop(path)

    def rename(self, text: str) -> str:
        for url, local in self.copies.items():
            text = text.replace(local, url)
        return text

    def _drop(self, url: str) -> None:
        copy = self.on_demand.pop(url, None)
        if copy is not None:
            copy.release()
        local = self.copies.pop(url, None)
        if local is not None and os.path.exists(local):
            os.remove(local)

    def close(self) -> None:
        for lf in self.open.values():
            lf.close()
        self.open.clear()
        for copy in self.on_demand.values():
            copy.release()


def _run_items(fn: EnvFunction, items: list[_Item], count_all: bool, meta: Meta, files: _Files,
               each: Callable[[int, EnvOutcome], Any]) -> None:
    """``fn`` on each item in turn, its streams opened through ``files``; ``each(position, outcome)``.
    _Changed where a file is no longer the one the parent read."""
    try:
        for j, (k, item) in enumerate(items):
            each(k, fn(files.work(item), count_all, meta))
            files.keep_only(items[j + 1][1] if j + 1 < len(items) else None)
    except LedgerError as exc:
        text = files.rename(str(exc))
        raise (type(exc)(text) if text != str(exc) else exc) from None
    finally:
        files.close()


# ---------------------------------------------------------------- worker processes on this machine

def _verified(work: Sequence[EnvWork]) -> dict[str, list[str]]:
    """{file path: members read through and CRC-checked} of the files of ``work``'s streams."""
    out: dict[str, list[str]] = {}
    for w in work:
        for s in (w.env_stream, w.trainer_stream):
            for p in s.pieces if s is not None else ():
                out[p.lf.path] = [name for name, src in p.lf._sources.items() if src.verified]
    return out


def _worker(conn: multiprocessing.connection.Connection, fn: EnvFunction, count_all: bool, meta: Meta,
            inherited: list[tuple[int, EnvWork]] | None) -> None:
    """A worker process: compares its envs, sending each outcome back as it has it. Forked, it reads the
    files the parent opened (``inherited``: their descriptors are its too, so it reads the very files the
    parent read, even where a writer has since replaced one); started afresh, it is sent the envs and
    opens their files by name, checking each is still the one the parent read."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it ends the workers
    _sigint(signal.SIG_UNBLOCK)  # blocked by the parent while it started this worker
    _die_with_parent()
    try:
        if inherited is not None:
            for k, w in inherited:
                conn.send(("env", k, fn(w, count_all, meta)))
                if w.env_stream is not None:
                    for p in w.env_stream.pieces:
                        p.lf.release()
            conn.send(("done", _verified([w for _, w in inherited])))
        else:
            items = conn.recv()
            try:
                _run_items(fn, items, count_all, meta, _Files(), lambda k, outcome: conn.send(("env", k, outcome)))
            except _Changed:
                conn.send(("changed",))
            conn.send(("done", {}))
    except (BrokenPipeError, EOFError, ConnectionResetError):
        pass  # the parent is gone: nothing to report to
    except BaseException as exc:  # noqa: B036  (reported to the parent, which raises it)
        try:
            conn.send(("error", exc))
        except Exception:
            conn.send(("error", LedgerError(one_line(exc))))
    finally:
        conn.close()


def _sigint(how: int) -> None:
    """Block or unblock SIGINT in this thread, where signals can be masked: a Ctrl-C while a worker is being
    forked is then delivered to the parent after the fork, not to its at-fork handlers or to the worker."""
    if hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(how, {signal.SIGINT})


def _die_with_parent() -> None:
    """Linux: this worker gets SIGKILL when its parent dies (killed too), so that none is left behind."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


@contextlib.contextmanager
def _main_not_rerun(forked: bool) -> Iterator[None]:
    """While a spawned worker starts: multiprocessing would have it import the caller's main script first (its
    code outside ``if __name__ == "__main__"`` would run again: a training script that compares at its end
    would train again). A worker needs none of it (what it runs is in stepledger), so main is not named to it."""
    main = sys.modules.get("__main__")
    if forked or main is None:
        yield
        return
    saved: dict[str, Any] = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _context() -> Any:
    """fork where it is safe (POSIX, no other thread in this process: an fsspec loop may hold a lock),
    else spawn."""
    if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _in_processes(fn: EnvFunction, work: Sequence[EnvWork], count_all: bool, meta: Meta, workers: int,
                  progress: Callable[[int, int], Any] | None) -> list[EnvOutcome]:
    ctx = _context()
    forked = ctx.get_start_method() == "fork"
    groups = plan(work, workers)
    results: list[Any] = [None] * len(work)
    procs: list[Any] = []
    pending: dict[Any, tuple[Any, list[int]]] = {}  # connection -> (process, its env positions)
    verified: dict[str, list[str]] = {}
    again: list[int] = []  # positions whose files changed under a worker: compared here
    done = 0
    if progress is not None:
        progress(0, len(work))
    try:
        for positions in groups:
            parent, child = ctx.Pipe()
            inherited = [(k, work[k]) for k in positions] if forked else None
            p = ctx.Process(target=_worker, args=(child, fn, count_all, meta, inherited), daemon=True,
                            name="stepledger-compare")
            _sigint(signal.SIG_BLOCK)
            try:
                with _main_not_rerun(forked):
                    p.start()
                procs.append(p)
            finally:
                _sigint(signal.SIG_UNBLOCK)  # a Ctrl-C meanwhile is raised here, once the worker is known
            child.close()
            pending[parent] = (p, positions)
            if not forked:
                parent.send(_items(work, positions))
        while pending:
            sentinels = {p.sentinel: conn for conn, (p, _) in pending.items()}
            for ready in multiprocessing.connection.wait(list(pending) + list(sentinels)):
                conn = sentinels.get(ready, ready)
                if conn not in pending:
                    continue
                p, positions = pending[conn]
                try:
                    # a connection that is ready has a message; a process that ended may have left some
                    while conn in pending and (ready is conn or conn.poll()):
                        msg = conn.recv()
                        if msg[0] == "env":
                            results[msg[1]] = msg[2]
                            done += 1
                            if progress is not None:
                                progress(done, len(work))
                        elif msg[0] == "error":
                            raise msg[1]
                        elif msg[0] == "changed":
                            again += [k for k in positions if results[k] is None]
                        else:
                            if forked:
                                verified.update(msg[1])
                            del pending[conn]
                            conn.close()
                        if ready is conn:
                            break
                except (EOFError, OSError):
                    _lost(p, positions, work)
                if conn in pending and ready is not conn:
                    _lost(p, positions, work)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(_JOIN_TIMEOUT)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in pending:
            conn.close()
    for k in again:
        results[k] = fn(work[k], count_all, meta)
    _mark_verified(work, verified)
    return results


def _mark_verified(work: Sequence[EnvWork], verified: dict[str, list[str]]) -> None:
    """Mark the members forked workers read through, and so CRC-checked, as verified in this process's
    files (the same open files): a report of a difference then re-reads only the rest."""
    for w in work:
        for s in (w.env_stream, w.trainer_stream):
            for p in s.pieces if s is not None else ():
                for name in verified.get(p.lf.path, ()):
                    p.lf.source(name).verified = True


def _lost(p: Any, positions: list[int], work: Sequence[EnvWork]) -> None:
    p.join(_JOIN_TIMEOUT)
    code = p.exitcode
    how = ("killed by signal %d" % -code) if isinstance(code, int) and code < 0 else "exit code %s" % code
    raise WorkerLost(wording.worker_lost("process %d" % p.pid, how, work[positions[0]].env,
                                         work[positions[-1]].env))


# ---------------------------------------------------------------- Ray tasks

def _ray_group(fn: EnvFunction, items: list[_Item], count_all: bool, meta: Meta) -> tuple[bool, list[tuple[int, Any]]]:
    """One Ray task: compare a group of envs, reading their files from where they are (a URL's fetched to a
    temporary directory of the task's own). (changed, [(position, outcome)]): changed where a file was no
    longer the one the driver read, the envs after it left to the driver."""
    out: list[tuple[int, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stepledger-task-") as local:
        try:
            _run_items(fn, items, count_all, meta, _Files(local), lambda k, outcome: out.append((k, outcome)))
        except _Changed:
            return True, out
    return False, out


def _join_ray(ray_arg: Any) -> Any:
    """The ray module, joined to the cluster ``ray_arg`` names (an address; True: the one joined, else "auto")."""
    try:
        import ray
    except ImportError:
        raise ImportError(wording.RAY_MISSING) from None
    if not ray.is_initialized():
        address = ray_arg if isinstance(ray_arg, str) else "auto"
        _reachable(address)
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except Exception as exc:  # ConnectionError, ValueError, RuntimeError...: one line, naming the address
            raise LedgerError(wording.ray_unreachable(address, one_line(exc))) from None
    return ray


_CONNECT_TIMEOUT = 10.0  # seconds to reach a cluster's address before it is called unreachable


def _reachable(address: str) -> None:
    """LedgerError, in one line, where ``address`` (HOST:PORT) takes no connection: ray.init would retry for
    minutes. "auto", ``ray://`` and other forms are left to ray.init."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    import socket
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=_CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise LedgerError(wording.ray_unreachable(address, exc.strerror or one_line(exc))) from None


def _on_ray(fn: EnvFunction, work: Sequence[EnvWork], count_all: bool, meta: Meta, ray_arg: Any, jobs: Any,
            progress: Callable[[int, int], Any] | None, ledgers: Sequence[Ledger]) -> list[EnvOutcome]:
    ray = _join_ray(ray_arg)

    def name(path: str) -> str:  # a URL's local copy, named by its URL: the task reads the URL itself
        for led in ledgers:
            path = led.rename(path)
        return path

    # one task per CPU of the cluster, or as many as ``jobs`` says
    tasks = check_jobs(jobs) if jobs is not None else max(1, int(ray.cluster_resources().get("CPU", 1)))
    groups = plan(work, min(tasks, max(1, len(work))))
    remote = ray.remote(num_cpus=1, max_retries=0)(_ray_group)
    futures = {remote.remote(fn, _items(work, positions, name), count_all, meta): positions for positions in groups}
    results: list[Any] = [None] * len(work)
    done = 0
    if progress is not None:
        progress(0, len(work))
    left = list(futures)
    try:
        while left:
            ready, left = ray.wait(left, num_returns=1)
            try:
                got = ray.get(ready[0])
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, BaseException):
                    raise cause from None
                raise LedgerError(one_line(exc)) from None
            except ray.exceptions.RayError as exc:
                positions = futures[ready[0]]
                raise WorkerLost(wording.worker_lost("a Ray task", one_line(exc), work[positions[0]].env,
                                                     work[positions[-1]].env)) from None
            changed, outcomes = got
            for k, outcome in outcomes:
                results[k] = outcome
            if changed:  # a ledger still being written was replaced: the rest of the group is compared here
                for k in futures[ready[0]]:
                    if results[k] is None:
                        results[k] = fn(work[k], count_all, meta)
            done += len(futures[ready[0]])
            if progress is not None:
                progress(done, len(work))
    finally:
        for f in left:
            ray.cancel(f, force=True)
    return results


__all__ = ["MIN_EVENTS_A_WORKER", "check_jobs", "compare_envs", "default_jobs", "plan"]
