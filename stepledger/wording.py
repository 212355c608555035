"""Report wording: each line a report prints is worded here, once.

compare, the live check, ``stepledger check`` and the episode check import
these functions; none of them composes these sentences itself. A differing
event, whether compare finds it in two ledgers or the live check in a token,
is worded by ``difference_line`` from the texts of ``event_values``.
"""

import json
import os
import re
import time

import numpy as np

from stepledger.format import schema as S
from stepledger import core
from stepledger import known_wrappers as KW
from stepledger.format.spaces import GraphValue, digest_signature, is_variable_description, unflatten

# Wrappers that change values on purpose, by the field they change: the examples a hint names when the
# trainer ledger names none (from the one table, stepledger.known_wrappers).
_FIELD_WORDS = {"obs": "observations", "reward": "rewards", "action": "actions", "truncated": "episode ends"}


def _examples(field, package, n=3):
    return KW.names_changing(field, package)[:n]


WRAPPERS_BY_FIELD = {f: ", ".join(_examples(f, "gymnasium") + _examples(f, "stable_baselines3")) + ", ..."
                     for f in ("obs", "reward", "action")}

INDEX_QUESTION = "is index= each env's position in the vector env?"


def copy_index_question(recorder=None):
    """The question an index hint of a multi-agent env side asks; ``recorder``: its class (``agent_recorder``)."""
    return ("is each %s's index its env copy's position in the vector env (index_supersuit_copies(venv) gives "
            "copy c index c, in SuperSuit's worker processes too)?" % (recorder or AGENT_RECORDER))


PLACEMENT = ("put the trainer-side ledger innermost, directly around the vector env, and LedgerEnv outermost in "
             "the worker")
# What moving a wrapper out of the two ledgers stops checking: every hint that advises a move says it.
NOT_CHECKED = "no longer checked (a fault in it would no longer show)"

# Multi-agent (stepledger.pettingzoo): the env-side class a hint names, by the class a multi-agent env ledger
# says recorded it (its meta's recorded_by), with the name of the env it wraps in the hints' examples and where
# the trainer-side ledger goes; a file that names none is LedgerParallelEnv's (the only class before LedgerAECEnv)
AGENT_RECORDER = "LedgerParallelEnv"
_AGENT_RECORDERS = {
    "LedgerParallelEnv": ("par_env", "directly around SuperSuit's vector env"),
    "LedgerAECEnv": ("aec_env", "where the trainer is handed the turns (TurnLedger in an agent_iter loop, or "
                                "directly around the vector env after aec_to_parallel)"),
}


def agent_recorder(meta):
    """The env-side class a multi-agent env ledger's hints name: its meta's ``recorded_by`` where that is one
    of stepledger's, else LedgerParallelEnv."""
    name = meta.get(S.META_RECORDED_BY)
    return name if name in _AGENT_RECORDERS else AGENT_RECORDER


# what sits between the env-side class and the trainer-side ledger and changes values on purpose, by what it
# changes, and where the two ledgers go instead
def agent_wrappers(field, recorder=None):
    text = "SuperSuit's %s around %s" % (" or ".join(_examples(field, "supersuit", 2)), recorder or AGENT_RECORDER)
    sb3 = [n for n in _examples(field, "stable_baselines3", 1)]
    return text + (", or %s on the vector env" % sb3[0] if sb3 else "")


def agent_placement(recorder=None):
    recorder = recorder or AGENT_RECORDER
    env, trainer = _AGENT_RECORDERS[recorder]
    return ("put %s around the SuperSuit wrappers that change values on purpose (%s(normalize_obs_v0(%s), "
            "directory)), and the trainer-side ledger %s; what a wrapper moved out does is then %s"
            % (recorder, recorder, env, trainer, NOT_CHECKED))


def _and(items):
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


# ---------------------------------------------------------------- wrong or duplicate index

def _index_hint(parts, pairs, unmatched, duplicates=(), copies=False):
    recorder = copies if isinstance(copies, str) else None
    text = _and(parts)
    unit = "env copy" if copies else "env"
    by_index: dict[int, list[int]] = {}
    for idx, env in pairs:
        by_index.setdefault(idx, []).append(env)
    dups = sorted(set(duplicates) | {idx for idx, envs in by_index.items() if len(envs) > 1})
    if unmatched:
        text += "; no %s matches the trainer's %s%s %s" % (
            "env ledger" if copies else "env-side stream", unit, "s" if len(unmatched) > 1 and not copies else "",
            _and(str(e) for e in sorted(unmatched)))
    if dups:
        text += "; index=%s was given to more than one %s%s" % (
            _and(str(i) for i in dups), unit, " (their ledger files overwrite each other)" if duplicates else "")
    return "hint: %s: %s" % (text, copy_index_question(recorder) if copies else INDEX_QUESTION)


def index_hint(pairs, unmatched=(), duplicates=(), copies=False):
    """Offline: env files whose streams match other trainer envs' streams.

    ``pairs`` lists (file index, trainer env) for streams that agree although
    the indices differ; ``unmatched`` the trainer envs no env file matches;
    ``duplicates`` the indices that more than one env was given (their files
    overwrote each other). With ``copies``, of a multi-agent env side: each
    file is an env copy's, whose every agent stream matches those of another
    env copy of the trainer's (``copies`` may be the env side's class,
    ``agent_recorder``, which the hint names).
    """
    unit = "env copy" if copies else "env"
    parts = ["env-%d.npz %s %s %d" % (idx, "matches the trainer's" if k == 0 else "its", unit, env)
             for k, (idx, env) in enumerate(pairs)]
    return _index_hint(parts, pairs, unmatched, duplicates, copies)


def live_index_hint(pairs):
    """Live: the first tokens of some envs carry other envs' indices; ``pairs`` as in ``index_hint``."""
    parts = [("the live tokens of index=%d arrive as the trainer's env %d" if k == 0 else
              "those of index=%d as its env %d") % (idx, env) for k, (idx, env) in enumerate(pairs)]
    return _index_hint(parts, pairs, ())


def duplicate_live_index(env, index, other):
    """A live token of an index another trainer env already receives."""
    return ("env %d receives the live tokens of LedgerEnv(index=%d), as env %d does: two envs were given "
            "index=%d; %s" % (env, index, other, index, INDEX_QUESTION))


def recorded_beside(path, pid, beside, live):
    """A recording that finds its path held by another writer (``live``: recording it now; else one that wrote it
    while this one recorded, closed since) records ``beside`` it instead."""
    held = "is being recorded by another ledger (process %s) right now" % pid if live else \
        "was written by another ledger (process %s) while this one recorded" % pid
    return ("stepledger: %s %s; this one records %s instead, and compare will name both: give each env its own "
            "index=" % (path, held, beside))


def overwritten_ledger(path, index):
    """A LedgerEnv about to replace a ledger file another LedgerEnv wrote during this one's run."""
    return ("LedgerEnv(index=%d): %s was written by another LedgerEnv since this one started, and this write "
            "replaces it: two envs were given index=%d? %s" % (index, path, index, INDEX_QUESTION))


def mixed_up_live(env, index, episode, step, agents=None):
    """Tokens of another env in the middle of a run: the envs' results were mixed up on the way."""
    return ("%s: received the live token of %s (episode %d, step %d): envs are mixed up on the way"
            % (stream_name(env, agents), stream_name(index, agents), episode, step))


# ---------------------------------------------------------------- multi-agent: the (env copy, agent) of each slot

SLOT_MAP_QUESTION = ("does the vector env order its slots as SuperSuit does (slot i: env copy i // n_agents, agent "
                     "possible_agents[i % n_agents])? If not, give the trainer side its map: "
                     "streams=stepledger.pettingzoo.slot_map(possible_agents, slots)")


def slot_name(slot, stream, agents):
    """A trainer's vector slot and the (env copy, agent) it is taken to carry: ``slot 4 (env 1, agent agent_1)``."""
    return "slot %d (%s)" % (slot, stream_name(stream, agents))


def live_slot_map(pairs, agents):
    """Live: the first tokens of some slots carry other (env copy, agent) pairs than the map says.

    ``pairs`` lists (slot, stream the map gives it, stream its tokens name).
    """
    parts = ["slot %d carries %s, not %s" % (slot, stream_name(carried, agents), stream_name(mapped, agents))
             for slot, mapped, carried in pairs]
    return ("the vector env's slots carry other (env copy, agent) pairs than the trainer side's map says: %s; %s"
            % ("; ".join(parts), SLOT_MAP_QUESTION))


def slot_map_hint(pairs, agents):
    """Offline: trainer streams whose events match the env streams of other (env copy, agent) pairs.

    ``pairs`` lists (trainer stream, env stream its first events match).
    """
    parts = ["the trainer's %s (stream %d) has the events of %s" % (stream_name(t, agents), t, stream_name(e, agents))
             for t, e in pairs]
    return "hint: %s: %s" % ("; ".join(parts), SLOT_MAP_QUESTION)


def not_a_slot_map(owner, slots, text):
    """A (env copy, agent) map that is not a permutation of the vector env's slots."""
    return "%s: slots=%r is not a map of the vector env's slots: %s" % (owner, slots, text)


# ---------------------------------------------------------------- wrappers inside the trainer-side ledger

def _where_example(names, owner, outside):
    """Where a wrapper goes once moved out of the two ledgers, as an example."""
    if outside:
        return "LedgerEnv(%s(env), directory, index=i)" % names[0]
    return "%s(%s(envs, path))" % (names[0], owner)


def deliberate_wrapper_warning(owner, names, outside=False):
    """The construction-time warning: wrappers known (or declared) to change values on purpose sit between
    the two ledgers: inside the trainer-side ledger, or around LedgerEnv in the vector env's envs."""
    one = len(names) == 1
    where = ("wrap%s LedgerEnv in the vector env's envs" if outside else
             "sit%s between this ledger and the vector env") % ("s" if one else "")
    moved = "part of the env" if outside else "outside the ledgers"
    return ("%s: %s %s and change%s values on purpose, so the envs will differ from their first events; %s "
            "(e.g. %s): what %s then does, %s, is %s; or pass check_wrappers=False if you mean to check through %s"
            % (owner, _and(names), where, "s" if one else "", PLACEMENT, _where_example(names, owner, outside),
               "it" if one else "each", moved, NOT_CHECKED, "it" if one else "them"))


def checked_wrapper_warning(owner, names, outside=False):
    """The construction-time warning: wrappers not known to change values on purpose (a user's own, a plain
    VectorWrapper) sit between the two ledgers, on the checked side."""
    one = len(names) == 1
    where = ("wrap%s LedgerEnv in the vector env's envs" if outside else
             "sit%s between this ledger and the vector env") % ("s" if one else "")
    move = "inside LedgerEnv" if outside else "out"
    return ("%s: %s %s, on the checked side: the values %s change%s are reported as differences, and those are "
            "%s doing; move %s %s (e.g. %s) only if %s change is intended: what %s does is then %s. A wrapper of "
            "yours that changes values on purpose: deliberate_wrappers=[%s] (or stepledger_changes_values = True "
            "on its class); check_wrappers=False silences this"
            % (owner, _and(names), where, "it" if one else "they", "s" if one else "", "its" if one else "their",
               "it" if one else "them", move, _where_example(names, owner, outside), "its" if one else "their",
               "it" if one else "each", NOT_CHECKED, ", ".join(names)))


def every_env_hint(field, n_envs, agent_streams=False, wrappers=(), recorder=None):
    """Every env (every agent stream of a multi-agent env ledger) differs in the same field from its first
    events. ``wrappers``: those the trainer-side ledger found between the two ledgers when it was built (its
    meta's ``wrappers``, stack.check_placement): named as changing values on purpose where the table (or the
    user) says so, else as on the checked side, their differences their doing. ``recorder``: the multi-agent
    env side's class (``agent_recorder``)."""
    kind = _FIELD_WORDS.get(field, field)
    recorder = recorder or AGENT_RECORDER
    between = "%s and the trainer-side ledger" % recorder if agent_streams else "the two ledgers"
    placement = agent_placement(recorder) if agent_streams else PLACEMENT
    if agent_streams:
        who = "all %d agent streams differ" % n_envs if n_envs > 1 else "the agent stream differs"
    else:
        who = "all %d envs differ" % n_envs if n_envs > 1 else "the env differs"
    first = "from %s first events" % ("their" if n_envs > 1 else "its")
    found = [w for w in wrappers or () if isinstance(w, dict) and isinstance(w.get("name"), str)]
    deliberate = [w["name"] for w in found if w.get("deliberate") is True
                  and (not isinstance(w.get("changes"), list) or field in w["changes"])]
    others = [w["name"] for w in found if w.get("deliberate") is not True]
    if deliberate:
        one = len(deliberate) == 1
        text = "%s, between %s, change%s %s on purpose" % (_and(deliberate), between, "s" if one else "", kind)
        if others:
            text += " (%s, also between them, on the checked side, may change them too)" % _and(others)
        text += "; if that change is all there is, %s" % placement
        if not agent_streams:
            text += "; what %s then does is %s" % (_and(deliberate), NOT_CHECKED)
        return "hint: %s in %s %s: %s" % (who, field, first, text)
    if others:
        one = len(others) == 1
        outside = all(w.get("where") == "around LedgerEnv" for w in found if w["name"] in others)
        return ("hint: %s in %s %s: %s sit%s between %s, on the checked side, and the "
                "differences are %s doing; move %s %s only if %s change is intended: what %s then does is %s"
                % (who, field, first, _and(others), "s" if one else "", between, "its" if one else "their",
                   "it" if one else "them", "inside LedgerEnv" if outside else "out of the two ledgers",
                   "its" if one else "their", "it" if one else "each", NOT_CHECKED))
    wrappers_text = (agent_wrappers(field, recorder) if field in WRAPPERS_BY_FIELD else None) if agent_streams \
        else WRAPPERS_BY_FIELD.get(field)
    cause = ("something between %s changes %s from the first events on: a wrapper that changes them on purpose%s "
             "does that, and so does a fault in anything else between them" % (
                 between, kind, " (%s)" % wrappers_text if wrappers_text else ""))
    return ("hint: %s in %s %s: %s; only if the change is intended, move that wrapper out: "
            "%s%s" % (who, field, first, cause, placement,
                      "" if agent_streams else "; what it then does is " + NOT_CHECKED))


TIME_LIMIT_HINT = ("hint: only truncated differs, and the trainer received True where the env gave False: a "
                   "TimeLimit (or another wrapper that ends episodes) outside LedgerEnv does that; put LedgerEnv "
                   "outermost in the worker, after TimeLimit: its episode ends are then the env's, and only their "
                   "way to the trainer is checked")


def agent_time_limit_hint(recorder=None):
    """TIME_LIMIT_HINT with multi-agent env ledgers (``recorder``: their class, ``agent_recorder``): PettingZoo
    has no TimeLimit; a wrapper of the PettingZoo env ends the episodes."""
    recorder = recorder or AGENT_RECORDER
    return ("hint: only truncated differs, and the trainer received True where the env gave False: a wrapper that "
            "ends episodes (a time limit) between %s and the trainer-side ledger does that; put %s around it "
            "(%s(time_limit(%s), directory)): its episode ends are then the env's, and only their way to the "
            "trainer is checked" % (recorder, recorder, recorder, _AGENT_RECORDERS[recorder][0]))

TRUNCATION_AS_TERMINATION_HINT = (
    "hint: truncation arrived as termination: at each of these steps the env truncated the episode and the "
    "trainer was told it terminated, so a trainer that bootstraps at time limits does not; SB3 reads truncation "
    "from info['TimeLimit.truncated'], which the vector env must set (SuperSuit's SB3 wrapper never does: "
    "PettingZoo issue 1126)")


# ---------------------------------------------------------------- where the differences fall (--all)

def _from(episode, step):
    return "from step %d on" % step if episode == 0 else "from episode %d, step %d on" % (episode, step)


def pattern(field, n, stats, episode, step):
    """Where one field's ``n`` differing events fall, from the env's first difference (at episode, step) on.

    ``stats`` holds, from the first difference on: ``events``, ``steps``,
    ``ends`` (episode-ending steps), ``starts`` (first steps of an episode),
    and for this field ``at_steps``, ``at_ends``, ``at_starts``.
    """
    head = "%s differs" % field
    if n == 1:
        return "%s at one event only" % head
    if stats["at_ends"] == n:
        text = "%s at the last step of %d of %d episodes" % (head, n, stats["ends"])
        if field == "obs":
            text += " (final observations: an autoreset convention?)"
        elif field in ("terminated", "truncated"):
            text += " (episode ends: a time limit sent as the wrong kind, or dropped?)"
        return text
    if stats["at_starts"] == n:
        return "%s at the first step of %d of %d episodes" % (head, n, stats["starts"])
    if n == stats["events"]:
        return "%s at every event %s" % (head, _from(episode, step))
    if stats["at_steps"] == n and n == stats["steps"]:
        return "%s at every step %s" % (head, _from(episode, step))
    return "%s at %d of %d events %s" % (head, n, stats["events"], _from(episode, step))


# ---------------------------------------------------------------- stepledger check: a rollout too short

# The fault met the events it needs, and changed none of their values: no rollout, however long, would
# show it on this env (1.0 survives float16; a Discrete action has no value to clip).
NO_OPPORTUNITY = ("no opportunity: it changed none of the values it met, which this env's values survive "
                  "(a longer rollout would not change that)")
_END_WORDS = {"end": "an episode end", "termination": "a termination", "truncation": "a truncation"}


def _env(env):
    """An env index, or a stream already named (``env 1, agent agent_1``)."""
    return env if isinstance(env, str) else "env %d" % env


def too_few_steps(env, made, at):
    return "the rollout is too short: %s made %d steps; the fault waits for step %d" % (_env(env), made, at)


def end_only_before(env, need, at):
    return "the rollout is too short: %s had %s only before step %d" % (_env(env), _END_WORDS[need], at)


def never_ended_so(env, need):
    """Episodes ended, never this way: the env does not give this fault a chance (not a failure)."""
    return "no opportunity: %s's episodes never ended with %s in this rollout" % (_env(env), _END_WORDS[need])


def no_episode_end(env, made, time_limit=None):
    if time_limit:
        return ("the rollout is too short: no episode of %s ended in its %d steps, and its time limit is %d"
                % (_env(env), made, time_limit))
    return "the rollout is too short: no episode of %s ended in its %d steps (give the env a time limit)" % (
        _env(env), made)


def never_left_early(env):
    """agent:pad in a rollout where the agent never left while the others went on (not a failure)."""
    return ("no opportunity: %s never left while the other agents went on (agent:pad needs an env whose agents "
            "leave apart)" % _env(env))


SB3_FORM_BLIND = ("SuperSuit's SB3 wrapper tells the trainer every end as a termination: a fault that trades "
                  "termination and truncation cannot show through it")


def fault_result(fault, outcome, reason=None, at=None, said=None):
    """One fault's line: ``outcome`` is "not exercised" (for ``reason``), "located", "caught" (not located:
    ``said`` is compare's line) or "missed"; ``at`` is (env, episode, step) where it was injected."""
    if outcome == "not exercised":
        return "%-22s not exercised (%s)" % (fault, reason)
    where = place(*at)
    if outcome == "located":
        return "%-22s caught and located  (injected at %s)" % (fault, where)
    if outcome == "caught":
        return "%-22s caught, NOT located (injected at %s; compare said: %s)" % (fault, where, said)
    return "%-22s NOT caught          (injected at %s)" % (fault, where)


def clean_run(report_text=None):
    """The check's first line: the run without faults; ``report_text`` is compare's report where it differs."""
    return "clean run: %s" % ("no difference" if report_text is None else "DIFFERS\n" + report_text)


def ledgers_in(directory):
    return "ledgers in %s" % directory


def check_verdict(n_located, n_exercised, ok, short=None):
    """The check's last line. ``short`` is (faults without an opportunity, faults, steps, steps needed)."""
    if short is not None:
        n_short, n_faults, steps, needs = short
        verdict = ("the boundary is NOT checked: %d of %d faults had no opportunity in a rollout of %s steps; it "
                   "needs at least %d (--steps %d)" % (n_short, n_faults, steps, needs, needs))
    elif not n_exercised:
        verdict = "the boundary is NOT checked: no fault was exercised"
    else:
        verdict = "the boundary is checked" if ok else "the boundary is NOT fully checked"
    return "%d of %d exercised faults caught and located; %s" % (n_located, n_exercised, verdict)


# ---------------------------------------------------------------- settings

SETTING_NAMES = {S.META_REWARD_DTYPE: "reward dtype", S.META_OBS_SPACE: "observation space",
                 S.META_ACT_SPACE: "action space"}


def different_settings(key, env_text, trainer_text, agent_streams=False):
    """The two sides recorded with different settings: offline compare and the live check both say this.
    ``agent_streams``: the env side is multi-agent (stepledger.pettingzoo): True, or the class that recorded
    it (``agent_recorder``)."""
    recorder = agent_streams if isinstance(agent_streams, str) else AGENT_RECORDER
    msg = "the two sides recorded different %ss: env %s, trainer %s" % (SETTING_NAMES[key], env_text, trainer_text)
    if key == S.META_REWARD_DTYPE:
        return msg + "; pass the same reward_dtype to both sides"
    if agent_streams:
        return msg + ("; a wrapper that changes the space (SuperSuit's %s, ... around %s, or %s on the vector "
                      "env) probably sits between %s and the trainer-side ledger: %s"
                      % (", ".join(_examples("space", "supersuit")), recorder,
                         _examples("space", "stable_baselines3", 1)[0], recorder, agent_placement(recorder)))
    return msg + ("; a wrapper that changes the space (%s, ...) probably sits between a ledger and the vector env: "
                  "%s; what it then does is %s" % (", ".join(_examples("space", "gymnasium", 2) + _examples(
                      "space", "stable_baselines3", 1)), PLACEMENT, NOT_CHECKED))


def settings_difference(env_meta, trainer_meta):
    """The line saying which setting the two sides recorded differently, or None.

    Spaces that differ only in what digests do not depend on (Box bounds)
    are the same setting. Offline compare asks this of the two metas, the
    live check of the settings sent with an env's first token.
    """
    found = differing_setting(env_meta, trainer_meta)
    if found is None:
        return None
    key, env_text, trainer_text = found
    return different_settings(key, env_text, trainer_text,
                              agent_recorder(env_meta) if env_meta.get(S.META_POSSIBLE_AGENTS) else False)


def differing_setting(a_meta, b_meta):
    """(key, a's value as JSON, b's) of the first setting two ledgers recorded differently, or None."""
    for key in S.SETTINGS:
        a, b = a_meta.get(key), b_meta.get(key)
        if (digest_signature(a) != digest_signature(b)) if key != S.META_REWARD_DTYPE else a != b:
            return key, json.dumps(a, sort_keys=True), json.dumps(b, sort_keys=True)
    return None


def live_settings(owner, env, text, agents=None):
    """The live check refuses at an env's first token: its LedgerEnv (an agent's LedgerParallelEnv, with the
    ``agents`` of a multi-agent env side) records with other settings."""
    return "%s: %s's %s(live=True) records with other settings than this ledger: %s" % (
        owner, stream_name(env, agents), "LedgerParallelEnv" if agents else "LedgerEnv", text)


# ---------------------------------------------------------------- a differing event

def stream_name(env, agents=None):
    """How a report names a stream: ``env 3``, or with the agents of a multi-agent env ledger (stream
    c * n + k is agent k of env copy c, stepledger.pettingzoo) ``env 1, agent agent_0``."""
    if agents:
        return "env %d, agent %s" % (env // len(agents), agents[env % len(agents)])
    return "env %d" % env


def position(episode, step):
    """Where an event is in its stream: ``episode 0, step 13``."""
    return "episode %d, step %d" % (episode, step)


def place(env, episode, step, agents=None):
    """Where an event is, as every report line names it."""
    return "%s, %s" % (stream_name(env, agents), position(episode, step))


def kind_text(kind):
    kind = int(kind)
    return S.KIND_NAMES.get(kind, str(kind))


ENV_GAVE, TRAINER_RECEIVED = "env gave", "trainer received"  # both sides' values, as every report names them
FIRST_AT = "first at"  # the first element of a kept value that differs


def difference_line(env, episode, step, fields, env_values, trainer_values, detail=None, agents=None):
    """One differing event: its place, the fields that differ and, where known, both sides' values.

    ``env_values`` and ``trainer_values`` map a field to its printed value
    (``event_values``, ``values_text``); ``detail`` a field to the first
    element that differs.
    """
    detail = detail or {}
    verb = "differs" if len(fields) == 1 else "differ"
    known = [f for f in fields if f in env_values and f in trainer_values]
    text = "%s: %s %s" % (place(env, episode, step, agents), ", ".join(fields), verb)
    if known:
        parts = []
        for f in known:
            gave = "%s %s, %s %s" % (ENV_GAVE, env_values[f], TRAINER_RECEIVED, trainer_values[f])
            if f in detail:
                gave += ", %s %s" % (FIRST_AT, detail[f])
            parts.append(gave if len(fields) == 1 else "%s: %s" % (f, gave))
        text += " (" + "; ".join(parts) + ")"
    return text


def one_side_line(env, side, events, agents=None):
    """An env recorded on one side only."""
    other = "trainer" if side == "env" else "env"
    return "%s: recorded only on the %s side (%d events); the %s ledger has no stream for it" % (
        stream_name(env, agents), side, events, other)


def no_env_ledger_yet(env, events):
    """A trainer stream of a run in progress whose env has no ledger of this run yet."""
    return ("env %d: no env ledger of this run yet (the trainer ledger is in progress, %s events so far): not "
            "compared" % (env, f"{events:,}"))


def withheld_obs(counts):
    """Observations the library withheld from the trainer, as it says it does (per env, how many)."""
    total = sum(counts.values())
    envs = ", ".join(str(e) for e in sorted(counts))
    return ("%s the trainer never had, withheld by the library as it says it does (a final observation under "
            "TorchRL's auto_reset or compact_obs, the reset after a collector's last batch, or a reset cut short by "
            "the next under reset_at_each_iter), in env%s %s: "
            "the env's were taken in their place, not a difference"
            % ("%d observation%s" % (total, "" if total == 1 else "s"), "s" if len(counts) > 1 else "", envs))


def length_line(env, episode, step, env_events, trainer_events, agents=None):
    """Two streams that agree as far as both go, in a run that ended cleanly: one stops early."""
    shorter = "trainer" if trainer_events < env_events else "env"
    shared = min(env_events, trainer_events)
    where = ("after episode %d, step %d" % (episode, step)) if shared else "before its first event"
    return ("%s: the %s stream stops early, %s (env side %d events, trainer side %d); "
            "the %d events both sides have agree" % (stream_name(env, agents), shorter, where, env_events,
                                                     trainer_events, shared))


def event_values(fields, ours, theirs, reward_dtype):
    """Both sides' printed values of the differing fields that the digests alone tell.

    ``ours`` and ``theirs`` map a field to its column value (reward bits,
    flags, digests). Rewards and flags are always known; an obs or action
    digest only when it is the missing or invalid marker (its values are
    worded by ``values_text``, where kept). Returns (env values, trainer values).
    """
    env_values, tr_values = {}, {}
    for f in fields:
        if f == "kind":
            env_values[f], tr_values[f] = kind_text(ours[f]), kind_text(theirs[f])
        elif f == "reward":
            env_values[f], tr_values[f] = reward_text(ours[f], reward_dtype), reward_text(theirs[f], reward_dtype)
        elif f in ("terminated", "truncated"):
            env_values[f], tr_values[f] = str(bool(ours[f])), str(bool(theirs[f]))
        else:
            a, b = digest_text(ours[f]), digest_text(theirs[f])
            if a or b:
                env_values[f], tr_values[f] = a or "a value", b or "a value"
    return env_values, tr_values


def counts_line(env, counts, agents=None):
    """With --all: how many events differ per field, after and including the first."""
    text = ", ".join("%s %d" % (f, n) for f, n in counts.items() if n)
    return "%s: events that differ, after and including the first: %s" % (
        stream_name(env, agents), text or "none of the compared fields")


def reset_step_trained(agents=None):
    """The env's step after an episode end was a reset (next-step autoreset: EnvPool, CartPoleVectorEnv), and
    the trainer recorded it as a step: it was trained on as a transition, with an action the env ignored."""
    who = "the agent" if agents else "the env"
    return ("%s was reset here (next-step autoreset: its action was ignored), but the trainer recorded a step: "
            "the reset step was trained on as a real transition (mask it, as a NEXT_STEP trainer does)" % who)


def untold_end(env, agents, flag, extra):
    """The env ended the episode at a step the trainer was told nothing of (both flags false), and the
    trainer then received ``extra`` steps the env never took: padding, or a phantom step."""
    who = "agent %s" % agents[env % len(agents)] if agents else "the env"
    ended = "left here (%s)" % flag if agents else "ended its episode here (%s)" % flag
    text = "%s %s but the trainer was not told" % (who, ended)
    if extra == 1:
        text += ", and then received a step the env never took"
    elif extra > 1:
        text += ", and then received %d%s steps the env never took" % (extra, " or more" if extra >= 64 else "")
    if extra:
        # what was seen is the padding; a wrapper known to pad is named as one possible cause, not as the cause
        text += " (%s counted here, not as more differences%s)" % (
            "it is" if extra == 1 else "they are",
            "; SuperSuit's black_death_v3 is one wrapper known to pad an agent that left" if agents else "")
    return text


def agents_differ(differences):
    """With multi-agent env ledgers: which agents differ, and in which env copies; None otherwise."""
    where: dict[str, list[int]] = {}
    for d in differences:
        if d.agents:
            where.setdefault(d.agents[d.env % len(d.agents)], []).append(d.env // len(d.agents))
    if not where:
        return None
    return "agents that differ: " + "; ".join(
        "%s (env %s)" % (agent, ", ".join(str(c) for c in sorted(set(copies)))) for agent, copies in where.items())


def envs_differ(n_differ, n_envs, agent_streams=False):
    """The count line: how many of the compared streams differ. Each stream of a multi-agent env ledger
    (stepledger.pettingzoo) is one agent of one env copy, not an env: there, "agent streams"."""
    return "%d of %d %s differ" % (n_differ, n_envs, streams_word(agent_streams))


def streams_word(agent_streams=False):
    """What a report counts: envs, or the agent streams of multi-agent env ledgers."""
    return "agent streams" if agent_streams else "envs"


VALUES_HINT = "hint: record with keep_values=True on both sides to see the observations and actions that differ"


# ---------------------------------------------------------------- runs and how they ended (compare's notes)

def when(t):
    """A Unix time as the report prints it: the time of day, and the date unless it is today."""
    local = time.localtime(t)
    if time.strftime("%Y-%m-%d", local) == time.strftime("%Y-%m-%d"):
        return time.strftime("%H:%M:%S", local)
    return time.strftime("%Y-%m-%d %H:%M:%S", local)


def other_run_id(run, written, trainer_run):
    """Why an env ledger is of another run: its run id is another (``written``: when, if known)."""
    return "is from another run (run %s%s; this trainer ledger is run %s)" % (
        run, ", written %s" % when(written) if isinstance(written, (int, float)) else "", trainer_run)


def other_run_before(updated, trainer_started):
    return "is from another run (written %s, before this trainer ledger began at %s)" % (
        when(updated), when(trainer_started))


def other_run_after(started, trainer_updated):
    return "is from another run (begun %s, after this trainer ledger ended at %s)" % (
        when(started), when(trainer_updated))


# How a recording had ended when its file was written (its meta's state), where it did not close cleanly.
ENDED = {S.STATE_INTERRUPTED: "interrupted (an exception escaped a step or reset)",
         S.STATE_EXIT: "written as its process exited without close()",
         S.STATE_SIGNAL: "written when its process got SIGTERM"}
IN_PROGRESS = "in progress"


def _cut_by(interrupted_by):
    """What escaped a recorded step or reset (its meta's interrupted_by), in the user's terms."""
    if interrupted_by == "KeyboardInterrupt":
        return "Ctrl-C"
    return "an exception (%s)" % interrupted_by if interrupted_by not in (None, "Exception") else "an exception"


def ended(state, interrupted_by=None):
    """How a recording had ended when its file was written (ENDED), and what cut its run short where it knows."""
    text = ENDED.get(state)
    if text is None or interrupted_by is None:
        return text
    if state == S.STATE_INTERRUPTED:
        return "interrupted (%s escaped a step or reset)" % _cut_by(interrupted_by)
    return "%s, after %s" % (text, _cut_by(interrupted_by))


def ended_by_trainer(trainer_state, interrupted_by, parent):
    """An env ledger written on SIGTERM in a worker process whose parent was the trainer's process (pid ``parent``),
    whose ledger ended ``trainer_state``: the trainer's process ended its workers, as vector envs do."""
    after = " after %s" % _cut_by(interrupted_by) if interrupted_by is not None else ""
    if trainer_state == S.STATE_SIGNAL:
        return ("written when its process got SIGTERM, as the trainer's process (pid %d, its parent) did: a kill or "
                "a scheduler's signal; the trainer's process ends its workers then" % parent)
    how = {S.STATE_EXIT: ", which exited without close()%s" % after,
           S.STATE_INTERRUPTED: ", which closed%s" % after,
           S.STATE_CLOSED: ", which closed the vector env",
           S.STATE_OPEN: ", while the trainer ledger was open"}.get(trainer_state, "")
    return ("ended by the trainer's process (pid %d, its parent)%s: a vector env ends its worker processes with "
            "SIGTERM when the program exits, closes it or lets go of it (AsyncVectorEnv, SubprocVecEnv), and each "
            "wrote its ledger then" % (parent, how))


def still_open(alive):
    """A recording whose file says it is open; ``alive``: its writer runs (True), is gone (False), unknown."""
    if alive:
        return IN_PROGRESS
    return "not closed (its process is gone)" if alive is False else "not closed"


def died_whole(mapped, kept_values=False):
    """A recording whose process died (a kill, a crash) and whose mapped part held its last events; with
    ``kept_values`` (keep_values=True), the values of those events, which a mapped part does not hold."""
    line = "its process died, and every event it recorded is read (%s from its mapped part)" % f"{mapped:,}"
    if kept_values:
        line += ", but not their kept values (a mapped part holds digests only: values up to its last spill)"
    return line


def died_before_its_first_event(path, mapped):
    """A ledger path with no file or segment, only the empty mapped part of a recording whose process died."""
    return ("%s: nothing was recorded there: its process died before its first event (%s, its mapped part, "
            "holds none; the next recording at this path removes it)" % (path, os.path.basename(mapped)))


def rebooted(events):
    """A recording whose machine rebooted since: its mapped part is not read (format/mapped.py)."""
    return ("its machine rebooted since (another boot id): read up to its last spill, which was on disk, leaving "
            "out the %s events in its mapped part, as pages that may never have been written" % f"{events:,}")


def rebooted_nothing():
    return ("its machine rebooted since it was recorded (another boot id) and it had no spill on disk: its "
            "mapped part may hold pages that never reached the disk, so none of it is read")


def died_during(env, entry):
    """An env side whose process died in a step (its mapped part noted the step's action, and no result)."""
    action = entry.get("action")
    took = "it had taken action %s; " % action if action is not None else ""
    if entry.get("step", 1) == 0:
        return "env %s: its process died during the first reset (the reset never returned)" % env
    return "env %s: its process died during step %d of episode %d (%sthe step never returned)" % (
        env, entry.get("step", 0), entry.get("episode", 0), took)


def ledger_note(name, ended, updated, events):
    """A ledger that was not closed cleanly: how it ended, when it was last written, how much it holds."""
    last = ", last written %s" % when(updated) if isinstance(updated, (int, float)) else ""
    return "%s: %s%s, %s events so far" % (name, ended, last, f"{events:,}")


def env_files_ended(env_dir, indices, ended):
    """The env files of ``env_dir`` that ended one way, at most four named."""
    names = ", ".join("env-%d.npz" % i for i in indices[:4]) + (
        " and %d more" % (len(indices) - 4) if len(indices) > 4 else "")
    return "%s: %s %s" % (env_dir, names, ended)


def ends_apart(env, which, gap, endings, shared, agents=None):
    """Streams that agree as far as both go, in a run that did not end cleanly: ``which`` side stopped
    ``gap`` events before the other's end; ``endings`` lists (side, how its ledger ended)."""
    why = "; ".join("the %s ledger: %s" % (side, ended) for side, ended in endings)
    return ("%s: records end at different points (the %s side stopped %d event%s before the other's end; %s); "
            "the %d events both sides have agree" % (stream_name(env, agents), which, gap, "" if gap == 1 else "s",
                                                     why, shared))


def spill_next_to_final(n_segments, final):
    """``stepledger show``: a spill directory whose ledger's final file is there too (a process killed after it
    wrote it, or while it cleaned up), one line for its ``n_segments`` segments."""
    one = n_segments == 1
    return ("%d spill segment%s next to the final file %s: read in its place only if %s of a later recording or "
            "hold%s more" % (n_segments, "" if one else "s", final, "it is" if one else "they are", "s" if one else ""))


# ---------------------------------------------------------------- how compare runs (report/parallel.py)

def bad_jobs(given):
    """``given``: the argument as the user wrote it (``jobs=0``; on the command line, its value: ``'0'``)."""
    return "%s: the number of worker processes must be a whole number, 1 or more" % given


def worker_lost(who, how, first_env, last_env):
    envs = "env %d" % first_env if first_env == last_env else "envs %d to %d" % (first_env, last_env)
    return ("the compare worker (%s) comparing %s ended before it was done (%s): the comparison is not whole, "
            "so no report is given; compare again" % (who, envs, how))


RAY_MISSING = "ray= (--ray) needs Ray, which is not installed here: pip install \"ray>=2\""


def ray_unreachable(address, why):
    return "the Ray cluster at %s cannot be joined (%s)" % (address, why)


def not_compared(name, reason):
    return "%s %s: not compared" % (name, reason)


def not_read(name, why, on_trainer_side):
    """compare: a file of the env directory named like an env ledger that cannot be read as one (a stray file, a
    damaged one); the rest is compared, and the command exits 3 where nothing else differs."""
    index = _ENV_INDEX.match(name)
    what = "env %s is not compared" % index.group(1) if index and on_trainer_side else "not compared"
    return "%s: not read, so %s: %s" % (name, what, why)


_ENV_INDEX = re.compile(r"^env-(\d+)\.")


def _indices(items):
    """``[1, 2, 3]`` as "1 to 3", ``[1, 3]`` as "1 and 3"; at most four named."""
    items = list(items)
    if len(items) > 2 and items == list(range(items[0], items[-1] + 1)):
        return "%d to %d" % (items[0], items[-1])
    if len(items) <= 4:
        return _and([str(i) for i in items])
    return "%s and %d more" % (", ".join(str(i) for i in items[:4]), len(items) - 4)


def env_file_alone(path, compared, others, agents=None):
    """compare: an env ledger file given in the env directory's place is compared alone: the streams it holds,
    not the trainer side's others."""
    kind = "agent stream" if agents else "env"
    plural = lambda items: kind + ("s" if len(items) != 1 else "")  # noqa: E731
    return ("%s given alone: %s %s compared, not the trainer side's %s %s" % (
        path, plural(compared), _indices(compared), plural(others), _indices(others)))


def recorded_twice(name, index):
    """A second recording of one index at the same time (env-N.dup-*.npz)."""
    return ("%s and env-%d.npz both recorded env %d at the same time: two LedgerEnvs were given index=%d; %s was "
            "not compared" % (name, index, index, index, name))


# How a copy of a recorded env was made (its meta's copy), for compare's line naming it (docs/INDICES.md).
COPY_MADE = {S.COPY_PICKLED: "unpickled or deep-copied",
             S.COPY_REBUILT: "built while env-{index}.npz was being recorded in its process: env.spec.make(), "
                             "gym.make(env.spec), gymnasium's check_env, an evaluation env from the same factory"}


def recorded_copy(name, index, events, made=None):
    """A copy of env ``index``'s LedgerEnv that recorded ``events`` of its own (env-N.copy-*.npz), or a second
    LedgerEnv of env ``index`` that the trainer side never linked (``made`` None: an evaluation env built from the
    training env's factory, most likely): named, not compared, not a difference."""
    if made is None:
        what = ("another LedgerEnv of env %d, not one of the trainer side's envs (an evaluation env built from the "
                "training env's factory, say)" % index)
    else:
        what = "a copy of env %d's LedgerEnv (%s)" % (index, COPY_MADE.get(made, made).format(index=index))
    return "%s: %s, recorded %s event%s of its own: not compared (docs/INDICES.md)" % (
        name, what, f"{events:,}", "" if events == 1 else "s")


def told_position(index, position):
    """An env ledger the trainer side told it is another position of its vector env than its index."""
    return ("env-%d.npz: its LedgerEnv is env %d of the trainer's vector env (the trainer side told it so): %s"
            % (index, position, INDEX_QUESTION))


# ---------------------------------------------------------------- the episode check

def _num(x):
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "invalid"
    return "%.8g" % x


def _pair_text(a, b):
    """Both numbers with enough digits to tell them apart."""
    for p in (8, 10, 12, 17):
        ta, tb = ("invalid" if np.isnan(a) else "%.*g" % (p, a)), ("invalid" if np.isnan(b) else "%.*g" % (p, b))
        if ta != tb or a == b:
            return ta, tb
    return ta, tb


def episode_difference(what, env, episode, index, logged, recorded, fields, n_logged, n_recorded, n_differ):
    """One line of the episode check (see episodes.EpisodeDifference for what each argument is)."""
    if what == "episode":
        if "return" in fields:
            lr, rr = _pair_text(logged[0], recorded[0])
        else:  # within tolerance: the digits that agree
            lr, rr = _num(logged[0]), _num(recorded[0])
        text = ("env %d, episode %d: logged return %s over %d steps, env recorded return %s over %d steps"
                % (env, episode, lr, logged[1], rr, recorded[1]))
        if n_logged is not None and n_logged != n_recorded:
            text += " (the log has %d episodes of this env, the env recorded %d)" % (n_logged, n_recorded)
        return text
    if what == "count":
        shared = min(n_logged, n_recorded)
        more = "the log has %d more" % (n_logged - shared) if n_logged > shared else \
            "the env recorded %d more, from episode %d on" % (n_recorded - shared, episode)
        return ("env %d: the log has %d episodes, the env recorded %d completed ones: %s; the %d both have agree"
                % (env, n_logged, n_recorded, more, shared))
    if what == "log_only":
        return "env %d: the log has %d episodes of this env, but no env ledger records it" % (env, n_logged)
    if what == "extra":
        return ("the log has %d more episodes than the envs recorded, from its episode %d on (logged return %s "
                "over %d steps)" % (n_logged, index, _num(logged[0]), logged[1]))
    if what == "unlogged":
        text = ("env %d, episode %d: env recorded return %s over %d steps; no logged episode matches it"
                % (env, episode, _num(recorded[0]), recorded[1]))
        if n_differ and n_differ > 1:
            text += " (%d episodes of this env are unmatched)" % n_differ
        return text
    if what == "unrecorded":
        text = ("log episode %d: logged return %s over %d steps matches no episode the envs recorded"
                % (index, _num(logged[0]), logged[1]))
        if n_differ and n_differ > 1:
            text += " (%d logged episodes are unmatched)" % n_differ
        return text
    return "env %s: %s" % (env, what)


def episodes_unmatched(n_unlogged, n_recorded, n_unrecorded, n_logged):
    return ("%d of %d recorded episodes and %d of %d logged episodes are unmatched"
            % (n_unlogged, n_recorded, n_unrecorded, n_logged))


def episodes_differ(n_envs_differ, n_envs, n_differ, n_compared):
    return "%d of %d envs differ; %d of %d compared episodes differ" % (n_envs_differ, n_envs, n_differ, n_compared)


def rllib_episode_differs(env, episode, what, name, logged, recorded, agents=None):
    """One figure of RLlib's episode metrics (stepledger.rllib.episodes) that the env ledgers do not bear out:
    ``what`` is "agent" (an agent's return and steps), "episode" (the episode's return) or "module" (a module's
    return; ``agents`` feed it); ``logged`` and ``recorded`` are (return, steps or None)."""
    def figure(pair):
        r, n = pair
        return "return %s" % _g6(r) + ("" if n is None else " over %d steps" % n)
    if what == "agent":
        where = "agent %s" % name
        logged_name = "agent_episode_returns"
    elif what == "module":
        feeds = ", ".join(agents or ()) or "no agent"
        where = "module %s (fed by %s)" % (name, feeds)
        logged_name = "module_episode_returns"
    else:
        where, logged_name = "the episode", "episode_return"
    hint = ""
    if what == "module" and agents and len(agents) > 1:
        hint = "; the env recorded %s for its agents, which add up to %s" % (
            ", ".join(_g6(r) for r in recorded[2:]) if len(recorded) > 2 else "returns", _g6(recorded[0]))
    return "env %d, episode %d, %s: RLlib logged %s (%s), env recorded %s%s" % (
        env, episode, where, figure(logged), logged_name, figure(recorded[:2]), hint)


def _g6(x):
    return "%.6g" % x


def rllib_episodes_counted(n_episodes_differ, n_compared, n_differences):
    return "%d of %d logged episodes differ (%d figures)" % (n_episodes_differ, n_compared, n_differences)


def rllib_episodes_unpaired(n):
    return "note: %d logged episodes have agents whose episode the env ledgers do not hold as ended (a run " \
           "that ended before their ledgers were written?); not compared" % n


EPISODE_MODE_NOTES = {
    "order": "note: the log has no env index; its episodes were paired with the envs' in completion order "
             "(the vector step each ended at, then env index)",
    "multiset": "note: episodes were matched as a multiset of (return, length), so a difference cannot be "
                "pinned to one env for certain",
}
MULTISET_BY_DEFAULT = ("note: the log has no env index and the envs' completion order cannot be derived (their "
                       "streams hold different numbers of steps), so episodes were matched as a multiset of "
                       "(return, length)")
ORDER_GUESSED = ("note: episodes were paired in completion order, but the envs' streams hold different numbers of "
                 "steps, so that order is a guess")
PARTIAL_EPISODES = ("note: the env ledger is partial: its process stopped before writing it, so it was read from its "
                    "spilled segments")


def unfinished_episodes(running):
    """``running``: the steps so far of each env's last, unfinished episode."""
    span = "%d" % running[0] if min(running) == max(running) else "%d to %d" % (min(running), max(running))
    one = len(running) == 1
    return ("note: %d unfinished episode%s (the last of %s env's ledger, %s steps so far) %s not compared"
            % (len(running), "" if one else "s", "its" if one else "their", span, "is" if one else "are"))


def cut_episodes(n_cut):
    return ("note: %d episodes ended by a reset before terminated or truncated are not compared (trainers' logs "
            "skip them too)" % n_cut)


def stray_steps(n):
    return "note: %d steps outside any episode (after an episode's end or before the first reset) are not compared" % n


# ---------------------------------------------------------------- the live check

def damaged_token(env, token, agents=None):
    return "%s: the live token is damaged (%r)" % (stream_name(env, agents), token)


def out_of_order(env, episode, step, counter, expected, agents=None):
    return ("%s: events out of order: the env sent its event %d where the trainer expected event %d"
            % (place(env, episode, step, agents), counter, expected))


def event_not_given(env, episode, step, kind, agents=None):
    """Tokens were arriving, and this event has none: the env never produced it."""
    return ("%s: the trainer received a %s the env did not give (no live token: a step skipped and filled in on "
            "the way?)" % (place(env, episode, step, agents), S.KIND_NAMES.get(kind, "event")))


def no_live_token(owner, env):
    return ("%s: env %d's events arrive without a live token (is LedgerEnv(live=True) outermost in its worker, and "
            "does the bridge carry info?); the live check is not active for env %d" % (owner, env, env))


# ---------------------------------------------------------------- values

def reward_text(bits, dtype):
    """A reward from its stored bits: the shortest digits that round-trip."""
    bits = int(bits)
    if bits == core.INVALID_DIGEST:
        return "invalid"
    if dtype == "float32":
        return str(np.array(bits & 0xFFFFFFFF, dtype=np.uint32).view(np.float32)[()])
    return repr(float(np.array(bits, dtype=np.uint64).view(np.float64)[()]))


def digest_text(h):
    """A digest that is a marker ("missing", "invalid"), or None for a digest of a value."""
    h = int(h)
    if h == core.MISSING_DIGEST:
        return "missing"
    if h == core.INVALID_DIGEST:
        return "invalid"
    if h == core.WITHHELD_DIGEST:
        return "withheld"
    return None


def array_text(arr, limit=12):
    """Shortest round-trip digits per element; long arrays shortened with their shape."""
    arr = np.asarray(arr)
    if arr.ndim == 0:
        return str(arr[()])
    if arr.size <= limit:
        return _nested(arr)
    flat = arr.reshape(-1)
    head = ", ".join(str(x) for x in flat[:3])
    tail = ", ".join(str(x) for x in flat[-3:])
    return "[%s, ..., %s] (shape %s)" % (head, tail, "x".join(str(d) for d in arr.shape))


def _nested(arr):
    if arr.ndim == 1:
        return "[" + ", ".join(str(x) for x in arr) + "]"
    return "[" + ", ".join(_nested(sub) for sub in arr) + "]"


def _shape_text(shape):
    return "(%s)" % "".join("%d," % d for d in shape) if len(shape) == 1 else "(%s)" % ", ".join(map(str, shape))


def _leaf_text(arr, declared):
    """A leaf's values; with its shape when that is not the space's (a value kept as it came)."""
    text = array_text(arr)
    shape = np.shape(arr)
    if declared is not None and tuple(shape) != tuple(declared):
        text += " (shape %s, the space's is %s)" % (_shape_text(shape), _shape_text(declared))
    return text


def _value_text(value):
    """A value rebuilt by spaces.unflatten, as a report prints it."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join("%r: %s" % (k, _value_text(v)) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    if isinstance(value, GraphValue):
        edges = "none" if value.edges is None else "%s, edge_links=%s" % (array_text(value.edges),
                                                                          array_text(value.edge_links))
        return "Graph(nodes=%s, edges=%s)" % (array_text(value.nodes), edges)
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "stacked":
        return "%d stacked: %s" % (value[1], _value_text(value[2]))
    if isinstance(value, tuple):
        return "(" + ", ".join(_value_text(v) for v in value) + ")"
    return array_text(value)


def values_text(leaves, names, shapes=None, space=None):
    """A kept value from its leaves (named ``names``, of the space's ``shapes``), as a report prints it."""
    if space is not None and is_variable_description(space):
        try:
            return _value_text(unflatten(space, leaves))
        except (ValueError, TypeError):
            return "[%s] (leaves that do not fit the space)" % ", ".join(array_text(v) for v in leaves)
    shapes = list(shapes) if shapes is not None and len(shapes) == len(leaves) else [None] * len(leaves)
    if len(leaves) == 1 and names == [""]:
        return _leaf_text(leaves[0], shapes[0])
    return "{" + ", ".join("%s: %s" % (n, _leaf_text(v, d)) for n, v, d in zip(names, leaves, shapes)) + "}"


# ---------------------------------------------------------------- the env's index, given later (LedgerEnv)

SET_INDEX_HOW = ("give each LedgerEnv its index before its first reset: index=, set_index(i) "
                 "(env.get_wrapper_attr(\"set_index\")(i) through wrappers; envs.set_attr(\"stepledger_index\", "
                 "[...]) gives each env of a vector env its own), or a trainer-side ledger around the vector env")


def index_given_twice(index, source, new):
    return ("LedgerEnv: set_index(%d): this env already has index %d (from %s); an env's index is given once"
            % (new, index, source))


def index_after_events(new, index, events, path):
    if index is None:
        return ("LedgerEnv: set_index(%d) after this env recorded its first events without an index (they go to "
                "%s): its index is fixed at its first event; %s" % (new, path, SET_INDEX_HOW))
    return ("LedgerEnv: set_index(%d) after this env recorded %d event%s as env %d: its index is fixed at its "
            "first event" % (new, events, "" if events == 1 else "s", index))


def index_taken(index, path):
    return ("LedgerEnv: index %d is already given to another LedgerEnv in this process, which records %s: "
            "give each env its own index (vector env call() gives every env the same arguments; set_attr with "
            "a list gives each its own)" % (index, path))


def live_without_index():
    return "LedgerEnv(live=True) has no index at its first event, and a live token names its env: " + SET_INDEX_HOW


def unindexed_warning(path):
    return ("stepledger: LedgerEnv had no index at its first event; it records to %s, which compare names but "
            "cannot pair with a trainer stream: %s" % (path, SET_INDEX_HOW))


def unindexed_linked(position, path):
    return ("stepledger: the trainer side says this LedgerEnv is env %d of its vector env, but it recorded its "
            "first events without an index (to %s): build the trainer-side ledger before the first reset"
            % (position, path))


def unindexed_note(name, events, position=None, matches=None):
    """compare: an env ledger recorded without an index, left out."""
    told = "" if position is None else ", told later that it is env %d" % position
    text = ("%s: recorded by a LedgerEnv that had no index at its first event%s; its %s events were not "
            "compared" % (name, told, f"{events:,}"))
    if matches is not None:
        text += "; its first events match the trainer's env %d" % matches
    return text


# ---------------------------------------------------------------- several trainer files (compare)

def wrong_order(env_path, trainer_path):
    return ("%s and %s are given in the wrong order: the env directory comes first, then the trainer file"
            % (env_path, trainer_path))


def env_in_several_trainer_files(env, names, more=0):
    """An env's stream with events in more than one trainer file of one run: compare refuses."""
    return ("env %d appears in more than one trainer file (%s)%s: each env must be in exactly one trainer "
            "ledger; give each learner's TrainerLedger the global index of each env it records"
            % (env, _and(names), " and so do %d more envs" % more if more else ""))


def slices_do_not_tile(env, first, last, before, name, gap, agents=None):
    """Events ``first`` to ``last`` of one stream, which several trainer files hold in slices, are in none of
    them (``gap``) or in two (read.stitch): ``before`` holds the slice before, ``name`` the next; the stream
    named as every line names it (``stream_name``: with the agents of a multi-agent env ledger)."""
    if gap:
        where = "the slice before them is in %s" % before if before is not None else "no slice before them"
        return ("%s: its events %d to %d are in no trainer file (%s; the next, from event %d, is in %s): they "
                "never reached a learner" % (stream_name(env, agents), first, last, where, last + 1, name))
    return "%s: %s" % (stream_name(env, agents), _twice(first, last, before, name))


def _twice(first, last, before, name):
    return "its events %d to %d are in two trainer files (%s and %s): a learner got them twice" % (
        first, last, before, name)


def overlap_line(env, episode, step, first, last, before, name, agents=None):
    """The difference an overlap makes (read.stitch), at its first event: events ``first`` to ``last`` of the
    stream are in the trainer file ``before`` and again in ``name``."""
    return "%s: %s" % (place(env, episode, step, agents), _twice(first, last, before, name))


def different_trainer_settings(name, first, what, text, first_text):
    return ("%s was recorded with another %s than %s (%s, not %s): the trainer files of one run record alike"
            % (name, SETTING_NAMES.get(what, what), first, text, first_text))


def earlier_trainer_run(name, written, began, newest):
    return ("%s is from an earlier run (written %s, before %s began at %s): not compared"
            % (name, written, newest, began))


# ---------------------------------------------------------------- stepledger show

def count(n, word, many=None):
    """``n`` and its noun, singular or plural: "1 event", "1,204 events", "2 episodes started"."""
    if n == 1:
        return "1 %s" % word
    return "%s %s" % (f"{n:,}", many if many is not None else word + "s")


def show_date(t):
    """A Unix time as show prints it: a local date and time (the meta holds the number)."""
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return "unknown"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def show_streams(n_streams, n_empty, events):
    """show FILE: how many streams and events, the streams with no events counted, not listed one by one."""
    empty = " (%s with no events, not listed)" % f"{n_empty:,}" if n_empty else ""
    return "  %s%s, %s" % (count(n_streams, "stream"), empty, count(events, "event"))


def show_stream(env, events, resets):
    """show FILE: one stream that has events."""
    return "  env %d: %s, %s, %s" % (env, count(events, "event"), count(resets, "episode started", "episodes started"),
                                     count(events - resets, "step"))


def show_directory(path, n_env, n_trainer, n_other, events, partial=False):
    """show DIR: the head line, a directory of ledgers (``partial``: some read from their spilled segments)."""
    parts = [count(n, word) for n, word in ((n_env, "env ledger"), (n_trainer, "trainer ledger"),
                                            (n_other, "other ledger")) if n or word == "env ledger"]
    return "%s: a directory of %s, %s%s" % (path, _and(parts), count(events, "event"),
                                           ", partial (some read from spilled segments)" if partial else "")


def show_ledger(name, what, events, resets, ended, started, updated, pid):
    """show DIR: one line per ledger. ``what``: whose it is (env 3, a copy of env 0's LedgerEnv, trainer side...);
    ``resets`` None where not counted; ``ended``: how its recording ended (None: closed)."""
    counts = count(events, "event")
    if resets is not None:
        counts += " (%s, %s)" % (count(resets, "episode started", "episodes started"), count(events - resets, "step"))
    first, last = show_date(started), show_date(updated)
    if first[:10] == last[:10] and first != "unknown":
        last = last[11:]  # the same day: its time only
    return "  %s: %s, %s, %s, %s to %s%s" % (
        name, what, counts, ended or "closed", first, last, ", process %d" % pid if isinstance(pid, int) else "")


def show_trainer_streams(n_streams, n_empty):
    """show DIR: a trainer ledger's streams, those with no events counted."""
    return "trainer side, %s%s" % (count(n_streams, "stream"), " (%s with no events)" % f"{n_empty:,}"
                                   if n_empty else "")
