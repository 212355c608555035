"""Live check: each event's token, sent by the env side in info, checked by the trainer side as it arrives.

``LedgerEnv(..., live=True)`` attaches a token (see ``_schema.TOKEN_FORMAT``)
to the info of every event: its env index, event counter, episode and step,
kind, three digests and flags. The trainer-side ledger, with ``live=True``,
compares each token with its own record of the same event and raises
``BoundaryFault`` at the first mismatch (or warns, or calls a function), so a
fault is caught at the step where it happens, not after the run.
"""

import json
import struct
import warnings

from stepledger.format import schema as S
from stepledger import wording
from stepledger.errors import SettingsError

# The live check's counts where training is watched (the SB3 logger: stepledger.sb3.LogLiveCheck and
# StopOnBoundaryFault), under these names (docs/LIVE.md, "Where training is watched"):
METRIC_FAULTS = "stepledger/boundary_faults"  # boundary faults found so far: an env's first (later ones follow from it)
METRIC_CHECKED = "stepledger/events_checked"  # events checked against their live tokens so far

_TOKEN = struct.Struct(S.TOKEN_FORMAT)
assert _TOKEN.size == S.TOKEN_SIZE


class BoundaryFault(Exception):
    """A value changed at the boundary, seen as it happened.

    ``env`` (the trainer's env: its vector slot), ``episode``, ``step`` (env
    side's position), ``fields`` (in report order), ``env_values`` and
    ``trainer_values`` (printed values where known). With a multi-agent env
    side (``stepledger.pettingzoo``), ``copy`` and ``agent`` name the env copy
    and the agent of the slot's stream; None otherwise. The message is the
    comparison report's line for it.
    """

    def __init__(self, message, env, episode, step, fields, env_values=None, trainer_values=None, stream=None,
                 agents=None):
        super().__init__(message)
        self.env, self.episode, self.step, self.fields = env, episode, step, tuple(fields)
        self.env_values = env_values or {}
        self.trainer_values = trainer_values or {}
        self.copy = self.agent = None
        if agents:
            stream = env if stream is None else stream
            self.copy, self.agent = stream // len(agents), agents[stream % len(agents)]


def unpack_token(token):
    """(index, counter, episode, step, kind, h_obs, h_act, h_rew, terminated, truncated), or None."""
    if not isinstance(token, (bytes, bytearray)) or len(token) != S.TOKEN_SIZE:
        return None
    version, index, counter, episode, step, kind, h_obs, h_act, h_rew, flags = _TOKEN.unpack(token)
    if version != S.TOKEN_VERSION:
        return None
    return index, counter, episode, step, kind, h_obs, h_act, h_rew, bool(flags & 1), bool(flags & 2)


def fault_from_event(env, token, trainer_event, reward_dtype, counter_expected, stream=None, agents=None):
    """A BoundaryFault for a token that disagrees with the trainer's event, or None.

    ``trainer_event`` is (kind, h_obs, h_act, h_rew, terminated, truncated);
    ``stream`` the env stream the trainer's env ``env`` carries (itself by
    default; a multi-agent slot's (env copy, agent) stream), ``agents`` the
    multi-agent env's possible_agents (or None).
    """
    stream = env if stream is None else stream
    parsed = unpack_token(token)
    if parsed is None:
        return BoundaryFault(wording.damaged_token(stream, token, agents), env, None, None, ("token",),
                             stream=stream, agents=agents)
    index, counter, episode, step, kind, h_obs, h_act, h_rew, te, tr = parsed
    if index != stream:
        return BoundaryFault(wording.mixed_up_live(stream, index, episode, step, agents), env, episode, step,
                             ("env",), stream=stream, agents=agents)
    if counter != counter_expected:
        return BoundaryFault(wording.out_of_order(stream, episode, step, counter, counter_expected, agents),
                             env, episode, step, ("order",), stream=stream, agents=agents)
    t_kind, t_obs, t_act, t_rew, t_te, t_tr = trainer_event
    ours = {"kind": kind, "action": h_act, "obs": h_obs, "reward": h_rew, "terminated": te, "truncated": tr}
    theirs = {"kind": t_kind, "action": t_act, "obs": t_obs, "reward": t_rew, "terminated": t_te, "truncated": t_tr}
    fields = ["kind"] if kind != t_kind else [f for f in S.FIELDS[1:] if ours[f] != theirs[f]]
    if not fields:
        return None
    env_values, tr_values = wording.event_values(fields, ours, theirs, reward_dtype)
    line = wording.difference_line(stream, episode, step, fields, env_values, tr_values, agents=agents)
    return BoundaryFault(line, env, episode, step, fields, env_values, tr_values, stream, agents)


def settings_of(reward_dtype, obs_layout, act_layout):
    """What both sides must record alike, as the ledger's meta names it (spaces by their digest signature)."""
    from stepledger.format.spaces import digest_signature
    return {S.META_REWARD_DTYPE: str(reward_dtype), S.META_OBS_SPACE: digest_signature(obs_layout.description),
            S.META_ACT_SPACE: digest_signature(act_layout.description)}


def settings_message(reward_dtype, obs_layout, act_layout, agents=None):
    """The env side's settings as sent with its first token (bytes: a plain immutable value); a
    multi-agent env side also names its possible_agents, so that the trainer side names each slot's agent."""
    settings = settings_of(reward_dtype, obs_layout, act_layout)
    if agents:
        settings[S.META_POSSIBLE_AGENTS] = S.agent_names(agents)
    return json.dumps(settings, sort_keys=True).encode()


def deliver(fault, on_fault):
    """Raise, warn or call, as the wrapper was told."""
    if on_fault == "raise":
        raise fault
    if on_fault == "warn":
        warnings.warn(str(fault), stacklevel=4)
    else:
        on_fault(fault)


class LiveCheck:
    """The trainer side's live check, shared by LedgerVectorEnv and LedgerVecEnv.

    Calls ``recorder.check`` (one call into the core per vector step), warns
    once per env whose events arrive without a token, and turns a mismatch
    into a BoundaryFault, delivered as ``on_fault`` says: "raise" (default),
    "warn", "record" (kept in ``faults`` only; the SB3 callback uses it) or a
    callable. Every fault is also kept in ``faults``.
    """

    def __init__(self, recorder, reward_dtype, on_fault, owner, settings=None, streams=None):
        self.rec = recorder
        self.reward_dtype = reward_dtype
        self.on_fault = on_fault
        self.owner = owner
        self.settings = settings  # this side's settings_of(...), checked against each env's first token
        self.streams = streams    # the env stream each env (slot) carries; None: env i carries stream i
        self.agents = None        # a multi-agent env side's possible_agents, from its first token's settings
        self.faults = []
        self.later = {}  # env (slot) -> mismatches after its first fault: not delivered, they follow from it
        self._silent = set()

    def _stream(self, i):
        return i if self.streams is None else self.streams[i]

    def metrics(self):
        """{METRIC_FAULTS: faults found so far, METRIC_CHECKED: events checked so far}: every event of the envs
        whose tokens arrive is checked as it comes (one sum over the envs, when asked: not on the step path)."""
        return {METRIC_FAULTS: len(self.faults), METRIC_CHECKED: int(self.rec.counts[self.rec.token_seen].sum())}

    def check_settings(self, values):
        """Refuse (SettingsError) when an env side sent settings that differ from this side's.

        ``values`` holds, per env, what arrived under ``SETTINGS_KEY`` (only
        with an env's first event), or None where nothing did.
        """
        if values is None or self.settings is None:
            return
        for i, value in enumerate(values):
            if not isinstance(value, (bytes, str)):
                continue
            try:
                theirs = json.loads(value)
            except (ValueError, RecursionError):
                continue
            if not isinstance(theirs, dict):
                continue
            agents = theirs.get(S.META_POSSIBLE_AGENTS)
            if not (isinstance(agents, list) and agents and all(isinstance(a, str) for a in agents)):
                agents = None
            text = wording.settings_difference(theirs, self.settings)
            if text:
                raise SettingsError(wording.live_settings(self.owner, i, text, agents))
            if agents:
                self.agents = agents

    def __call__(self, single, first=None, second=None):
        problems = self.rec.check(single, first, second)
        if not problems:
            return
        pending = []
        first_index = []  # (index in the token, env) for envs whose first token carries another index
        agents = self.agents
        for i, j, token in problems:
            stream = self._stream(i)
            if token is None and self.rec.token_seen[i]:
                # tokens were arriving: this event has none, so the env never produced it
                kind = self.rec.event(i, j)[0]
                ep, st = int(self.rec.token_episode[i]), int(self.rec.token_step[i])
                ep, st = (ep + 1, 0) if kind == S.KIND_RESET else (ep, st + 1)
                pending.append(BoundaryFault(wording.event_not_given(stream, ep, st, kind, agents), i, ep, st,
                                             ("kind",), stream=stream, agents=agents))
                continue
            if token is None:
                if i not in self._silent:
                    self._silent.add(i)
                    warnings.warn(wording.no_live_token(self.owner, i), stacklevel=4)
                continue
            expected = int(self.rec.counts[i]) - self.rec.events_in_call(i) + j
            parsed = unpack_token(token)
            if parsed is not None and parsed[0] != stream and parsed[1] == 0 == expected:
                first_index.append((parsed[0], i))
                continue
            fault = fault_from_event(i, token, self.rec.event(i, j), self.reward_dtype, expected, stream, agents)
            if fault is not None:
                pending.append(fault)
        if first_index:
            pending[:0] = self._slot_faults(first_index) if agents else self._index_faults(first_index)
        self._deliver(pending)

    def check_env(self, i, events, tokens):
        """Env i's latest ``events`` (each (kind, h_obs, h_act, h_rew, terminated, truncated), as recorded, the
        last of its stream) against the ``tokens`` that came with them, one each (None where none came): for a
        trainer that records an env's events many at a time (``TrainerLedger.env_steps(..., tokens=...)``)."""
        stream, pending = self._stream(i), []
        expected = int(self.rec.counts[i]) - len(events)
        for j, (event, token) in enumerate(zip(events, tokens)):
            if token is None:
                if self.rec.token_seen[i]:  # tokens were arriving: this event has none, so the env never produced it
                    ep, st = int(self.rec.token_episode[i]), int(self.rec.token_step[i])
                    ep, st = (ep + 1, 0) if event[0] == S.KIND_RESET else (ep, st + 1)
                    pending.append(BoundaryFault(wording.event_not_given(stream, ep, st, event[0], self.agents), i,
                                                 ep, st, ("kind",), stream=stream, agents=self.agents))
                    break  # what follows is shifted by it
                if i not in self._silent:
                    self._silent.add(i)
                    warnings.warn(wording.no_live_token(self.owner, i), stacklevel=4)
                continue
            fault = fault_from_event(i, token, event, self.reward_dtype, expected + j, stream, self.agents)
            if fault is not None:
                pending.append(fault)
                continue
            parsed = unpack_token(token)
            self.rec.token_seen[i] = True
            self.rec.token_episode[i], self.rec.token_step[i] = parsed[2], parsed[3]
        self._deliver(pending)

    def _deliver(self, pending):
        # An env's first fault is delivered; what its stream shows after it follows from it (a step filled
        # in shifts every later event, black_death_v3's padding never ends), as compare reports an env's
        # first difference: counted in ``later``, not delivered.
        fresh = []
        for fault in pending:
            if fault.env in self.later:
                self.later[fault.env] += 1
            else:
                self.later[fault.env] = 0
                fresh.append(fault)
        self.faults.extend(fresh)
        if self.on_fault != "record":
            for fault in fresh:
                deliver(fault, self.on_fault)

    def _slot_faults(self, pairs):
        """Multi-agent: slots whose first token names another (env copy, agent) than the map gives them, in one
        fault at the first of them (the map is wrong, or the vector env orders its slots another way)."""
        found = [(env, self._stream(env), index) for index, env in pairs]
        slot, mapped, carried = found[0]
        return [BoundaryFault(wording.live_slot_map(found, self.agents), slot, 0, 0, ("slot",), stream=carried,
                              agents=self.agents)]

    def _index_faults(self, pairs):
        """Faults for envs whose first token is another env's: duplicates named one by one, the rest in one line."""
        faults: list[BoundaryFault] = []
        rest: list[tuple[int, int]] = []
        claimed: dict[int, int] = {}
        for index, env in pairs:
            # env ``index`` receiving valid tokens of its own, or an env earlier in this list, has this index too
            own = index < len(self.rec.token_seen) and bool(self.rec.token_seen[index])
            owner = index if own else claimed.get(index)
            if owner is not None:
                faults.append(BoundaryFault(wording.duplicate_live_index(env, index, owner), env, 0, 0, ("index",)))
            else:
                rest.append((index, env))
            claimed.setdefault(index, env)
        if rest:
            faults.append(BoundaryFault(wording.live_index_hint(rest)[len("hint: "):], rest[0][1], 0, 0, ("index",)))
        return faults


def check_on_fault(on_fault, owner):
    if on_fault in ("raise", "warn", "record") or callable(on_fault):
        return on_fault
    raise ValueError("%s: on_fault must be 'raise', 'warn', 'record' or a callable, got %r" % (owner, on_fault))
