"""Report wording that names a cause: each line is worded here, once.

compare, the live check, ``stepledger check`` and the episode check import
these functions; none of them composes these sentences itself. (The per-env
difference lines are still composed in ``compare.EnvDifference.line``.)
"""

# Wrappers that change values on purpose, by what they change: the hint that names them.
WRAPPERS_BY_FIELD = {
    "obs": "NormalizeObservation, TransformObservation, FrameStackObservation, VecNormalize, VecFrameStack or "
           "VecTransposeImage",
    "reward": "NormalizeReward, TransformReward, ClipReward or VecNormalize",
    "action": "ClipAction, RescaleAction or TransformAction",
}

INDEX_QUESTION = "is index= each env's position in the vector env?"
PLACEMENT = ("put the trainer-side ledger innermost, directly around the vector env, and LedgerEnv outermost in "
             "the worker")


def _and(items):
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


# ---------------------------------------------------------------- wrong or duplicate index

def _index_hint(parts, pairs, unmatched, duplicates=()):
    text = _and(parts)
    by_index = {}
    for idx, env in pairs:
        by_index.setdefault(idx, []).append(env)
    dups = sorted(set(duplicates) | {idx for idx, envs in by_index.items() if len(envs) > 1})
    if unmatched:
        text += "; no env-side stream matches the trainer's env%s %s" % (
            "s" if len(unmatched) > 1 else "", _and(str(e) for e in sorted(unmatched)))
    if dups:
        text += "; index=%s was given to more than one env%s" % (
            _and(str(i) for i in dups), " (their ledger files overwrite each other)" if duplicates else "")
    return "hint: %s: %s" % (text, INDEX_QUESTION)


def index_hint(pairs, unmatched=(), duplicates=()):
    """Offline: env files whose streams match other trainer envs' streams.

    ``pairs`` lists (file index, trainer env) for streams that agree although
    the indices differ; ``unmatched`` the trainer envs no env file matches;
    ``duplicates`` the indices that more than one env was given (their files
    overwrote each other).
    """
    parts = ["env-%d.npz %s env %d" % (idx, "matches the trainer's" if k == 0 else "its", env)
             for k, (idx, env) in enumerate(pairs)]
    return _index_hint(parts, pairs, unmatched, duplicates)


def live_index_hint(pairs):
    """Live: the first tokens of some envs carry other envs' indices; ``pairs`` as in ``index_hint``."""
    parts = [("the live tokens of index=%d arrive as the trainer's env %d" if k == 0 else
              "those of index=%d as its env %d") % (idx, env) for k, (idx, env) in enumerate(pairs)]
    return _index_hint(parts, pairs, ())


def duplicate_live_index(env, index, other):
    """A live token of an index another trainer env already receives."""
    return ("env %d receives the live tokens of LedgerEnv(index=%d), as env %d does: two envs were given "
            "index=%d; %s" % (env, index, other, index, INDEX_QUESTION))


def wrong_live_index(env, index):
    """The first live token of an env carries another index."""
    return ("env %d receives the live tokens of LedgerEnv(index=%d) from its first event: %s"
            % (env, index, INDEX_QUESTION))


def overwritten_ledger(path, index):
    """A LedgerEnv about to replace a ledger file another LedgerEnv wrote during this one's run."""
    return ("LedgerEnv(index=%d): %s was written by another LedgerEnv since this one started, and this write "
            "replaces it: two envs were given index=%d? %s" % (index, path, index, INDEX_QUESTION))


def mixed_up_live(env, index, episode, step):
    """Tokens of another env in the middle of a run: the envs' results were mixed up on the way."""
    return ("env %d: received the live token of env %d (episode %d, step %d): envs are mixed up on the way"
            % (env, index, episode, step))


# ---------------------------------------------------------------- wrappers inside the trainer-side ledger

def inner_wrapper_warning(owner, names):
    """The construction-time warning: wrappers that change values sit inside the trainer-side ledger."""
    listed = _and(names)
    return ("%s: %s sit%s between this ledger and the vector env and change%s values on purpose, so the envs "
            "will differ from their first events; %s (e.g. %s(%s(envs, path))), or pass check_wrappers=False "
            "if you mean to check through %s" % (owner, listed, "s" if len(names) == 1 else "",
                                                 "s" if len(names) == 1 else "", PLACEMENT, names[0], owner,
                                                 "it" if len(names) == 1 else "them"))


def every_env_hint(field, n_envs):
    """Every env differs in the same field from its first events."""
    kind = {"obs": "observations", "reward": "rewards", "action": "actions"}.get(field, field)
    wrappers = WRAPPERS_BY_FIELD.get(field)
    cause = "a wrapper between the two ledgers that changes %s on purpose%s does that" % (
        kind, " (%s)" % wrappers if wrappers else "")
    who = "all %d envs differ" % n_envs if n_envs > 1 else "the env differs"
    return "hint: %s in %s from their first events: %s; %s" % (who, field, cause, PLACEMENT)


TIME_LIMIT_HINT = ("hint: only truncated differs, and the trainer received True where the env gave False: a "
                   "TimeLimit (or another wrapper that ends episodes) outside LedgerEnv does that; put LedgerEnv "
                   "outermost in the worker, after TimeLimit")


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

NO_OPPORTUNITY = "no opportunity in this rollout"
_END_WORDS = {"end": "an episode end", "termination": "a termination", "truncation": "a truncation"}


def too_few_steps(env, made, at):
    return "the rollout is too short: env %d made %d steps; the fault waits for step %d" % (env, made, at)


def end_only_before(env, need, at):
    return "the rollout is too short: env %d had %s only before step %d" % (env, _END_WORDS[need], at)


def never_ended_so(env, need):
    """Episodes ended, never this way: the env does not give this fault a chance (not a failure)."""
    return "no opportunity: env %d's episodes never ended with %s in this rollout" % (env, _END_WORDS[need])


def no_episode_end(env, made, time_limit=None):
    if time_limit:
        return ("the rollout is too short: no episode of env %d ended in its %d steps, and its time limit is %d"
                % (env, made, time_limit))
    return "the rollout is too short: no episode of env %d ended in its %d steps (give the env a time limit)" % (
        env, made)


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

SETTING_NAMES = {"reward_dtype": "reward dtype", "observation_space": "observation space",
                 "action_space": "action space"}


def different_settings(key, env_text, trainer_text):
    """The two sides recorded with different settings: offline compare and the live check both say this."""
    msg = "the two sides recorded different %ss: env %s, trainer %s" % (SETTING_NAMES[key], env_text, trainer_text)
    if key == "reward_dtype":
        return msg + "; pass the same reward_dtype to both sides"
    return msg + ("; a wrapper that changes the space (VecFrameStack, NormalizeObservation, ...) probably sits "
                  "between a ledger and the vector env: %s" % PLACEMENT)


def live_settings(owner, env, text):
    """The live check refuses at an env's first token: its LedgerEnv records with other settings."""
    return "%s: env %d's LedgerEnv(live=True) records with other settings than this ledger: %s" % (owner, env, text)
