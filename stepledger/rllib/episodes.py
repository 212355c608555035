"""RLlib's own episode metrics of a multi-agent run, checked against the episodes the env ledgers recorded.

RLlib's multi-agent env runner computes, for each episode that ended, its length and return, each agent's
return and steps, and each module's return (the agents mapped to one module added up), and hands them to its
metrics logger (``MultiAgentEnvRunner.get_metrics`` -> ``_log_episode_metrics``), which averages them into
``episode_return_mean``, ``agent_episode_returns_mean`` and ``module_episode_returns_mean``. An instrumented
multi-agent run writes those per-episode figures, as RLlib logged them, one JSON line an episode, with the
episode's env index and each agent's module, to ``PATH/rllib-episodes-N.jsonl`` (N: the runner's first env).

``check_rllib_episodes(env_dir)`` (``stepledger episodes PATH PATH/rllib-episodes-*.jsonl``) pairs each env's
logged episodes, in order, with the episodes its agents' streams recorded (agent a's k-th episode of env e
is the k-th of stream e * n + k that ended), and checks each agent's return and steps, the episode's return
(its agents' returns added up) and each module's return (the returns of the agents that feed it added up),
naming each one that differs.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import numpy as np

from stepledger.errors import LedgerError
from stepledger.format import schema as S
from stepledger.format import storage
from stepledger.report.base import DifferenceReport
from stepledger.report.episodes.derive import derive, open_env_ledger

LOG_FILE = "rllib-episodes-%d.jsonl"   # one env runner's: N its first env's index
RTOL = ATOL = 1e-5


# ---------------------------------------------------------------- in each env runner: what RLlib logs

def install_metrics_log(env_runner, path, base):
    """Wrap a multi-agent runner's ``get_metrics`` so that each episode RLlib logs is also written, as RLlib
    computed it, to ``path/rllib-episodes-{base}.jsonl`` (local directories only)."""
    if storage.is_remote(path) or getattr(env_runner, "_stepledger_metrics", None) is not None:
        return
    if not hasattr(env_runner, "_log_episode_metrics"):
        return  # another Ray: its metrics are not checked
    from stepledger.rllib.instrument import TAG
    out = os.path.join(path, LOG_FILE % base)
    get_metrics, log_one = env_runner.get_metrics, env_runner._log_episode_metrics
    env_runner._stepledger_metrics = out

    def logging_get_metrics(*args, **kwargs):
        # (set in the runner's constructor after its env was made: read at each call)
        done = list(getattr(env_runner, "_done_episodes_for_metrics", None) or ())
        logged = []

        def log_and_keep(length, ret, sec, agents=None, modules=None, agent_steps=None):
            logged.append((length, ret, agents, modules, agent_steps))
            return log_one(length, ret, sec, agents, modules, agent_steps)

        env_runner._log_episode_metrics = log_and_keep
        try:
            result = get_metrics(*args, **kwargs)
        finally:
            env_runner._log_episode_metrics = log_one
        lines = []
        for ep, (length, ret, agents, modules, steps) in zip(done, logged):
            env = ep.custom_data.get(TAG)
            if env is None:
                continue
            lines.append(json.dumps({
                "env": int(env), "length": int(length), "return": float(ret),
                "agents": {str(a): float(r) for a, r in (agents or {}).items()},
                "agent_steps": {str(a): int(n) for a, n in (steps or {}).items()},
                "modules": {str(m): float(r) for m, r in (modules or {}).items()},
                "agent_modules": {str(a): str(sa.module_id) for a, sa in ep.agent_episodes.items()}}))
        if lines:
            with open(out, "a") as f:
                f.write("\n".join(lines) + "\n")
        return result

    env_runner.get_metrics = logging_get_metrics


# ---------------------------------------------------------------- the check

def read_rllib_log(log: str) -> list[dict[str, Any]]:
    """The logged episodes of ``log`` (a ``rllib-episodes-*.jsonl`` file, a glob of them, or the directory
    that holds them), in order per env."""
    paths = sorted(glob.glob(os.path.join(log, "rllib-episodes-*.jsonl"))) if os.path.isdir(log) else \
        sorted(glob.glob(log))
    if not paths:
        raise LedgerError("%s: no RLlib episode log (rllib-episodes-N.jsonl, written by an instrumented "
                          "multi-agent run)" % log)
    rows = []
    for p in paths:
        with open(p) as f:
            for k, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    int(row["env"]), float(row["return"]), dict(row["agents"]), dict(row["modules"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise LedgerError("%s, line %d: not an RLlib episode log line (%s)" % (p, k + 1, exc)) from None
                rows.append(row)
    return rows


class RllibEpisodeDifference:
    def __init__(self, env, episode, what, name, logged, recorded, agents=None):
        self.env, self.episode, self.what, self.name = env, episode, what, name
        self.logged, self.recorded, self.agents = logged, recorded, agents

    def line(self) -> str:
        from stepledger import wording
        return wording.rllib_episode_differs(self.env, self.episode, self.what, self.name, self.logged,
                                             self.recorded, self.agents)

    __str__ = line

    def to_dict(self) -> dict[str, Any]:
        return {"env": self.env, "episode": self.episode, "type": self.what, "name": self.name,
                "logged": self.logged, "recorded": self.recorded, "agents": self.agents, "line": self.line()}


class RllibEpisodeReport(DifferenceReport):
    """The result of the RLlib metrics check: truthy when every logged figure agrees with the env ledgers."""

    def __init__(self, differences, n_episodes, n_compared, unpaired, source):
        self.differences, self.n_episodes, self.n_compared = differences, n_episodes, n_compared
        self.unpaired, self.source = unpaired, source

    def lines(self) -> list[str]:
        from stepledger import wording
        out = [d.line() for d in self.differences]
        out.append(wording.rllib_episodes_counted(len({(d.env, d.episode) for d in self.differences}),
                                                  self.n_compared, len(self.differences)))
        if self.unpaired:
            out.append(wording.rllib_episodes_unpaired(self.unpaired))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "episodes_logged": self.n_episodes, "episodes_compared": self.n_compared,
                "differences": [d.to_dict() for d in self.differences], "unpaired": self.unpaired,
                "log": {"source": self.source, "kind": "rllib"}, "lines": self.lines()}


def _close(logged, recorded, abs_sum, rtol, atol):
    return abs(logged - recorded) <= rtol * abs_sum + atol


def check_rllib_episodes(env_dir: str, log: str | None = None, *, rtol: float = RTOL,
                         atol: float = ATOL) -> RllibEpisodeReport:
    """Check the episode metrics an instrumented multi-agent RLlib run logged against its env ledgers.

    ``log``: the run's ``rllib-episodes-*.jsonl`` (a file, a glob, or the directory; by default ``env_dir``).
    Each env's logged episodes are paired in order with the episodes its agents' streams recorded; each
    agent's return and steps, the episode's return and each module's return are checked. Returns a
    RllibEpisodeReport (truthy when it agrees); raises LedgerError when it cannot check.
    """
    rows = read_rllib_log(os.fspath(log if log is not None else env_dir))
    ledger = open_env_ledger(env_dir)
    try:
        agents_of = {}
        for idx, st in ledger.streams.items():
            agents = st.meta.get(S.META_POSSIBLE_AGENTS)
            if not agents:
                raise LedgerError("%s: env %d's ledger has no possible_agents: not a multi-agent run's env ledger"
                                  % (env_dir, idx))
            agents_of[idx // len(agents)] = list(agents)
        recorded = derive(ledger)
    finally:
        ledger.close()
    cols = recorded.columns
    per_stream: dict[int, list[tuple[float, int, float]]] = {}
    for s, r, n, a in zip(cols["env"].tolist(), cols["ret"].tolist(), cols["length"].tolist(),
                          cols["abs_sum"].tolist()):
        per_stream.setdefault(int(s), []).append((r, n, a))
    taken: dict[int, int] = {}   # stream -> its episodes paired so far
    numbers: dict[int, int] = {}  # env -> its logged episodes so far
    diffs: list[RllibEpisodeDifference] = []
    compared, unpaired = 0, 0
    for row in rows:
        env = int(row["env"])
        episode = numbers[env] = numbers.get(env, -1) + 1
        agents = agents_of.get(env)
        if agents is None:
            unpaired += 1
            continue
        got: dict[str, tuple[float, int, float]] = {}
        for agent in row["agents"]:
            if agent not in agents:
                continue
            stream = env * len(agents) + agents.index(agent)
            k = taken.get(stream, 0)
            eps = per_stream.get(stream, [])
            if k < len(eps):
                got[agent] = eps[k]
                taken[stream] = k + 1
        if len(got) < len(row["agents"]):
            unpaired += 1  # an episode whose agents' ends the ledgers do not hold (yet)
            continue
        compared += 1
        for agent, logged in sorted(row["agents"].items()):
            r, n, a = got[agent]
            steps = row.get("agent_steps", {}).get(agent)
            if not _close(logged, r, a, rtol, atol) or (steps is not None and int(steps) != n):
                diffs.append(RllibEpisodeDifference(env, episode, "agent", agent, (logged, steps), (r, n)))
        total_r = sum(r for r, _, _ in got.values())
        total_a = sum(a for _, _, a in got.values())
        if not _close(float(row["return"]), total_r, total_a, rtol, atol):
            diffs.append(RllibEpisodeDifference(env, episode, "episode", None, (float(row["return"]), None),
                                                (total_r, None)))
        feeding: dict[str, list[str]] = {}
        for agent, module in sorted(row.get("agent_modules", {}).items()):
            feeding.setdefault(module, []).append(agent)
        for module, logged in sorted(row["modules"].items()):
            members = feeding.get(module, [])
            r = sum(got[a][0] for a in members if a in got)
            a = sum(got[m][2] for m in members if m in got)
            if not _close(logged, r, a, rtol, atol):
                diffs.append(RllibEpisodeDifference(env, episode, "module", module, (logged, None),
                                                    (r, None, *[got[m][0] for m in members if m in got]), members))
    return RllibEpisodeReport(diffs, len(rows), compared, unpaired, os.fspath(log or env_dir))
