"""The check's generic runner: one clean rollout, then one per fault, and whether compare located each.

Each library's ``check`` module builds its rollouts (``stepledger.gymnasium.check.check_boundary`` for
Gymnasium's and SB3's vector envs, ``stepledger.pettingzoo.check.check_parallel`` for SuperSuit's,
``stepledger.rllib.check.check_rllib`` for RLlib's) and hands them to ``run_check``, which runs them and
builds the ``CheckReport``. Like Gymnasium's ``check_env``, one call in a test suite.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import warnings
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from stepledger import wording
from stepledger._moved import names_of
from stepledger.faults.engine import Record, check_fault, needs, reported_fields

if TYPE_CHECKING:
    import gymnasium as gym

    from stepledger.report.compare import EnvDifference, Report

__getattr__ = names_of(__name__)  # check_boundary, check_parallel, ...: in the library folders now

#: a check's rollout, ``one(sub, fault)``: compare's report and where the fault was injected (None: nowhere)
Rollout = Callable[[str, "str | None"], "tuple[Report, Record | None]"]
#: ``opportunity(fault, clean_dir)``: why a fault found no opportunity, and the vector steps it needs (or None)
Opportunity = Callable[[str, str], "tuple[str, int | None]"]


def is_located(difference: EnvDifference | None, injected: Record | None) -> bool:
    """Whether compare's difference for an env names where the fault first changed a value, and
    exactly the fields it changed (``faults.reported_fields``, or the record's ``fields`` where the
    fault says which it changed: an agent's whole event).

    A skipped step that is never followed by a real one (``step:fill`` at
    every step) leaves the env stream shorter: compare then reports where it
    stops, one event before the fill.
    """
    d, inj = difference, injected
    if d is None or inj is None:
        return False
    if d.what in ("fields", "kind"):
        named, expected = set(d.fields), set(inj.get("fields") or reported_fields(inj["fault"]))
        fits = (bool(named) and named <= expected) if inj["fault"] == "step:fill" else named == expected
        return (d.episode, d.step) == (inj["episode"], inj["step"]) and fits
    if d.what == "length" and inj["fault"] == "step:fill":
        # a length difference with no event in common has no position: it cannot be a fill's, which follows
        # at least the env's reset
        return d.step is not None and (d.episode, d.step + 1) == (inj["episode"], inj["step"])
    return False


class FaultResult:
    """One fault's run: where it was injected and what compare said.

    ``short`` is set when the fault was not exercised because the rollout
    ended before its first opportunity (``needs`` then holds the vector steps
    a rollout needs); ``reason`` says why a fault had no opportunity.
    """

    def __init__(self, fault: str, injected: Record | None, difference: EnvDifference | None,
                 reason: str | None = None, needs: int | None = None, agents: Sequence[str] | None = None) -> None:
        self.fault, self.injected, self.difference = fault, injected, difference
        self.reason, self.needs = reason, needs
        self.agents = agents  # possible_agents, where the fault was injected on one agent's stream

    @property
    def short(self) -> bool:
        return not self.exercised and self.needs is not None

    @property
    def exercised(self) -> bool:
        return self.injected is not None

    @property
    def caught(self) -> bool:
        return self.exercised and self.difference is not None

    @property
    def located(self) -> bool:
        return self.caught and is_located(self.difference, self.injected)

    def line(self) -> str:
        """The report's line for this fault."""
        if self.injected is None:  # not exercised
            return wording.fault_result(self.fault, "not exercised", self.reason or wording.NO_OPPORTUNITY)
        inj = self.injected
        at = (inj.get("stream", inj["env"]), inj["episode"], inj["step"]) + ((self.agents,) if self.agents else ())
        if self.located:
            return wording.fault_result(self.fault, "located", at=at)
        if self.difference is not None:  # caught
            return wording.fault_result(self.fault, "caught", at=at, said=self.difference.line())
        return wording.fault_result(self.fault, "missed", at=at)


class CheckReport:
    """The outcome of check_boundary: truthy when the clean run is clean, at
    least one fault was exercised, every exercised fault was caught and
    located, and no fault went unexercised for lack of steps.

    ``needs`` is the number of vector steps a rollout needs for every fault
    to have its opportunity, when this one was too short (else None).
    ``directory`` is where the ledgers are, or None once they were removed.
    """

    def __init__(self, clean: Report, results: list[FaultResult], directory: str | None,
                 steps: int | None = None) -> None:
        self.clean, self.results, self.directory, self.steps = clean, results, directory, steps

    @property
    def needs(self) -> int | None:
        short = [r.needs for r in self.results if r.short and r.needs is not None]
        return max(short) if short else None

    @property
    def ok(self) -> bool:
        return (bool(self.clean) and any(r.exercised for r in self.results) and self.needs is None
                and all(r.located for r in self.results if r.exercised))

    def __bool__(self) -> bool:
        return self.ok

    @property
    def missed(self) -> list[str]:
        return [r.fault for r in self.results if r.exercised and not r.located]

    def __str__(self) -> str:
        lines = [wording.clean_run(str(self.clean) if not self.clean else None)]
        lines += [r.line() for r in self.results]
        n_ex = sum(r.exercised for r in self.results)
        n_ok = sum(r.located for r in self.results)
        short = None
        if self.needs is not None:
            short = (sum(r.short for r in self.results), len(self.results), self.steps, self.needs)
        lines.append(wording.check_verdict(n_ok, n_ex, self.ok, short))
        if self.directory is not None:
            lines.append(wording.ledgers_in(self.directory))
        return "\n".join(lines)


def clean_steps(directory: str, target: int, stream: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The target env's steps in the clean run: (terminated, truncated) per step, in order (``stream``:
    one agent's stream of env copy ``target``'s ledger)."""
    from stepledger.report.read import read
    with read(os.path.join(directory, "env-%d.npz" % target)) as ledger:
        cols = ledger.streams[target if stream is None else stream].columns
    steps = cols["kind"] == 1
    return np.asarray(cols["terminated"])[steps], np.asarray(cols["truncated"])[steps]


def no_opportunity(fault: str, term: np.ndarray, trunc: np.ndarray, at: int, target: int,
                   time_limit: Callable[[], int | None]) -> tuple[str, int | None]:
    """Why ``fault`` had no opportunity in the clean rollout, and the vector steps it would need (or None).

    ``time_limit()`` gives the env's TimeLimit (or None); it is asked only when no episode ended.
    """
    n = len(term)
    ends = np.flatnonzero(term | trunc)
    need = needs(fault)

    def vector_steps(env_steps: int, episode_len: int | None) -> int:
        # under NEXT_STEP each episode end before the last step takes one more vector step (the reset)
        return int(env_steps + (env_steps - 1) // episode_len) if episode_len else int(env_steps)

    mean_len = int(math.ceil(n / len(ends))) if len(ends) else None
    if need in ("any", "step") and n <= at:
        return wording.too_few_steps(target, n, at), vector_steps(at + 1, mean_len or time_limit())
    if need in ("any", "step"):
        return wording.NO_OPPORTUNITY, None
    which = {"end": ends, "termination": np.flatnonzero(term), "truncation": np.flatnonzero(trunc)}[need]
    if which.size and which[-1] >= at:
        return wording.NO_OPPORTUNITY, None
    if which.size:  # seen, but only before ``at``: one more such episode after ``at`` is enough
        return wording.end_only_before(target, need, at), vector_steps(at + int(which[0]) + 1, mean_len)
    if len(ends):  # episodes did end, never this way: the env does not end them like that
        return wording.never_ended_so(target, need), None
    limit = time_limit()
    if limit:
        return wording.no_episode_end(target, n, limit), vector_steps(limit * math.ceil((at + 1) / limit), limit)
    return wording.no_episode_end(target, n), vector_steps(max(n, at) + 1, None)


def time_limit(env_fn: Callable[[int], gym.Env[Any, Any]], target: int) -> int | None:
    """The max_episode_steps of ``env_fn(target)``'s spec, or None."""
    try:
        env = env_fn(target)
    except Exception:
        return None
    try:
        limit = getattr(getattr(env, "spec", None), "max_episode_steps", None)
        return int(limit) if limit else None
    finally:
        env.close()


def run_check(one: Rollout, faults: Sequence[str], opportunity: Opportunity, directory: str | os.PathLike[str] | None = None,
              keep: bool = False, steps: int | None = None, progress: Callable[[int, int], Any] | None = None,
              agents: Sequence[str] | None = None, prefix: str = "stepledger-check-") -> CheckReport:
    """The check's runs: ``one(sub, fault)`` runs a rollout into directory ``sub`` (``fault`` None: the
    clean one) and returns (compare's report, where the fault was injected or None); where a fault found
    no opportunity, ``opportunity(fault, clean_dir)`` says why and how many steps a rollout needs (or
    None). Returns the CheckReport; a temporary directory made here is removed when the check passes."""
    made = directory is None
    directory = os.fspath(directory) if directory is not None else tempfile.mkdtemp(prefix=prefix)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # step-after-done warnings from faulty flags are expected
            clean_dir = os.path.join(directory, "clean")
            clean, _ = one(clean_dir, None)
            if progress is not None:
                progress(1, len(faults) + 1)
            results: list[FaultResult] = []
            for k, fault in enumerate(faults):
                report, injected = one(os.path.join(directory, fault.replace(":", "_")), fault)
                stream: Any = injected.get("stream", injected["env"]) if injected else None
                diff = report.by_env().get(stream) if injected else None

                reason: str | None = None
                needs: int | None = None
                if injected is None:
                    reason, needs = opportunity(fault, clean_dir)
                results.append(FaultResult(fault, injected, diff, reason, needs, agents))
                if progress is not None:
                    progress(k + 2, len(faults) + 1)
    except BaseException:
        if made:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    out = CheckReport(clean, results, directory, steps)
    if made and out.ok and not keep:
        shutil.rmtree(directory, ignore_errors=True)
        out.directory = None
    return out


class _RegisteredEnv:
    """A picklable factory for a registered env id (for worker processes)."""

    def __init__(self, env_id: str, max_episode_steps: int | None) -> None:
        self.env_id, self.max_episode_steps = env_id, max_episode_steps

    def __call__(self, index: int) -> gym.Env[Any, Any]:
        import gymnasium as gym
        return gym.make(self.env_id, max_episode_steps=self.max_episode_steps)


def registered_env(env_id: str, max_episode_steps: int | None = None) -> Callable[[int], gym.Env[Any, Any]]:
    """A picklable factory for ``gym.make(env_id)``; refuses (ValueError, one line) an id that cannot be made."""
    import gymnasium as gym
    if max_episode_steps is not None and (max_episode_steps < 1):
        raise ValueError("max_episode_steps must be a positive int, got %r" % (max_episode_steps,))
    factory = _RegisteredEnv(env_id, max_episode_steps)
    try:
        factory(0).close()
    except (gym.error.Error, ImportError, ModuleNotFoundError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError("cannot make env %r: %s" % (env_id, text)) from None
    return factory


def faults_from(text: str | None, allowed: Sequence[str], where: str = "--faults") -> list[str]:
    """The faults named in a comma-separated ``text`` (None or empty: ``allowed``), each checked against
    ``allowed``; a ValueError naming ``where`` for one that is not."""
    if not text:
        return list(allowed)
    return [check_fault(f, allowed, where) for f in text.split(",")]


def positive_int(name: str, value: Any, owner: str, least: int = 1) -> int:

    """``value`` if it is an int of at least ``least``; a one-line ValueError naming ``owner`` and ``name`` if not."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError("%s: %s must be an int of at least %d, got %r" % (owner, name, least, value))
    return int(value)
