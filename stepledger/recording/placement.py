"""What sits between a trainer-side ledger and the vector env it records.

Whatever sits between the two ledgers is on the checked side: what it changes
is reported as a difference. ``wrappers_between`` walks the chain inside the
trainer-side ledger; ``outer_wrappers`` the wrappers around LedgerEnv in the
envs of a vector env that holds them in-process (SyncVectorEnv, SB3's
DummyVecEnv), where the single-env forms (FrameStackObservation has no other)
sit between the two ledgers too. Each is classified by
``stepledger.known_wrappers`` (the one list of wrappers that change values on
purpose, and of those that only watch) or by the user's declaration. The
trainer-side ledgers warn once at construction (``check_wrappers=False``
silences it) and keep what they found in their meta, for compare's hints.
"""

import warnings
from typing import Any

from stepledger import wording
from stepledger.known_wrappers import DECLARE_ATTR, DELIBERATE, UNKNOWN, WATCHES, known


def _declared_set(deliberate_wrappers, owner):
    """The classes and class names a user declared deliberate (``deliberate_wrappers=``), checked."""
    if deliberate_wrappers is None:
        return frozenset()
    items = [deliberate_wrappers] if isinstance(deliberate_wrappers, (str, type)) else deliberate_wrappers
    try:
        items = list(items)
    except TypeError:
        items = [items]
    for item in items:
        if not isinstance(item, (str, type)):
            raise ValueError("%s: deliberate_wrappers must be wrapper classes or class names, got %r"
                             % (owner, item))
    return frozenset(items)


def classify(env, declared=frozenset()):
    """(kind, fields) of one wrapper: DELIBERATE with the fields it changes on purpose (None where it was
    declared without saying which), WATCHES (it passes every value through), or UNKNOWN.

    A user's declaration comes first (``declared``: classes and class names, then the class attribute
    ``stepledger_changes_values``), then the table of stepledger.known_wrappers.
    """
    cls = type(env)
    if declared and any(c in declared or c.__name__ in declared for c in cls.__mro__[:-1]):
        return DELIBERATE, None
    said = getattr(cls, DECLARE_ATTR, None)
    if said is True:
        return DELIBERATE, None
    if said is False:
        return WATCHES, None
    if isinstance(said, (tuple, list)) and said:
        return DELIBERATE, tuple(str(f) for f in said)
    found = known(cls)
    if found is not None:
        return (DELIBERATE, found[2]) if found[2] else (WATCHES, None)
    return UNKNOWN, None


def _found(env, where, declared):
    kind, fields = classify(env, declared)
    if kind == WATCHES:
        return None
    return {"name": type(env).__name__, "deliberate": kind == DELIBERATE,
            "changes": None if fields is None else list(fields), "where": where}


def wrappers_between(env, declared=frozenset()):
    """The wrappers in ``env``'s chain (outermost first) down to the vector env, as described for the
    trainer ledger's meta (``{"name", "deliberate", "changes", "where": "inside"}``); those that only
    watch are left out. Follows Gymnasium's ``.env`` and SB3's ``.venv``; the vector env at the bottom
    (the first object that wraps nothing) is not a wrapper."""
    return _walk(env, declared)[0]


def _walk(env, declared):
    """(``wrappers_between``'s list, the object at the bottom of the chain), in one walk down it."""
    out, e = [], env
    for e in _chain(env):
        if own_attr(e, "venv") is None and own_attr(e, "env") is None:
            break
        found = _found(e, "inside", declared)
        if found is not None:
            out.append(found)
    return out, e


def value_changing_wrappers(env, declared=frozenset()):
    """Names of the wrappers in ``env``'s chain (outermost first) that change values on purpose."""
    return [w["name"] for w in wrappers_between(env, declared) if w["deliberate"]]


def own_attr(obj, name):
    """``obj``'s own attribute ``name`` (None where it has none), not one a wrapper forwards inward.

    Both libraries' wrappers forward unknown names to what they wrap (``__getattr__``); this
    lookup never calls it. Nor does it read ``obj.__dict__``: on CPython 3.11 that makes the
    object keep a real dict for the rest of its life, and every attribute access in its
    methods then takes the slow path (done on each env of a vector env at construction,
    it made every Pendulum step some 6% slower, which was most of the trainer side's
    measured overhead).
    """
    try:
        return object.__getattribute__(obj, name)
    except Exception:
        return None


def _chain(env):
    """``env`` and what it wraps, outermost first (Gymnasium's ``.env``, SB3's ``.venv``)."""
    seen = set()
    while env is not None and id(env) not in seen:
        seen.add(id(env))
        yield env
        inner = own_attr(env, "venv")
        env = inner if inner is not None else own_attr(env, "env")


def find_in_chain(env, cls):
    """The first object of type ``cls`` in ``env``'s chain (``env`` and what it wraps, through Gymnasium's
    ``.env`` and SB3's ``.venv``), or None."""
    return next((e for e in _chain(env) if isinstance(e, cls)), None)


def outer_wrappers(env, declared=frozenset(), bottom=None):
    """The wrappers around LedgerEnv in the envs of ``env``'s vector env, where it holds them in this process
    (``.envs``: SyncVectorEnv, DummyVecEnv), described as ``wrappers_between`` does (``"where": "around
    LedgerEnv"``), each once, in the order first found. Envs without a LedgerEnv in their chain are not
    looked into. ``bottom``: the chain's bottom where the caller has walked down to it."""
    if bottom is None:
        bottom = _walk(env, declared)[1]
    subs = own_attr(bottom, "envs")
    out, names = [], set()
    for sub in subs if isinstance(subs, (list, tuple)) else ():
        above: list[dict[str, Any]] = []
        for e in _chain(sub):
            if any(cls.__name__ == "LedgerEnv" for cls in type(e).__mro__):
                for w in above:
                    if w["name"] not in names:
                        names.add(w["name"])
                        out.append(w)
                break
            found = _found(e, "around LedgerEnv", declared)
            if found is not None:
                above.append(found)
    return out


def outer_env_wrappers(env, declared=frozenset()):
    """Names of the wrappers that change values on purpose around LedgerEnv in the envs of ``env``'s
    vector env (see ``outer_wrappers``)."""
    return [w["name"] for w in outer_wrappers(env, declared) if w["deliberate"]]


def check_placement(env, owner, check_wrappers=True, deliberate_wrappers=None):
    """The wrappers between the two ledgers that this process can see (``wrappers_between`` inside the
    trainer-side ledger, then ``outer_wrappers``), for the trainer ledger's meta; unless
    ``check_wrappers`` is False, one UserWarning for each kind found: those that change values on
    purpose, and the others, which are on the checked side."""
    declared = _declared_set(deliberate_wrappers, owner)
    inside, bottom = _walk(env, declared)
    outer = outer_wrappers(env, declared, bottom)
    if check_wrappers:
        for group, outside in ((inside, False), (outer, True)):
            deliberate = [w["name"] for w in group if w["deliberate"]]
            others = [w["name"] for w in group if not w["deliberate"]]
            if deliberate:
                warnings.warn(wording.deliberate_wrapper_warning(owner, deliberate, outside), UserWarning,
                              stacklevel=3)
            if others:
                warnings.warn(wording.checked_wrapper_warning(owner, others, outside), UserWarning, stacklevel=3)
    return inside + outer


def slot_infos(venv, infos):
    """A reset's infos one dict a slot, as a step's are.

    SuperSuit's vector env with worker processes (``concat_vec_envs_v1(...,
    num_cpus > 1)``, a ProcConcatVec, also inside its SB3 wrapper) returns a
    reset's infos as each worker's list of (slot within the worker, info)
    pairs (its step lays them out); the live tokens in them are found only
    once they are laid out. Any other infos are returned as they are.
    """
    if not isinstance(infos, list) or not infos or not isinstance(infos[0], list):
        return infos
    starts = None
    for e in _chain(venv):
        starts = own_attr(e, "idx_starts")
        if starts is not None:
            break
    if starts is None or len(starts) != len(infos) + 1:
        return infos
    out: list[dict[str, object]] = [{} for _ in range(starts[-1])]
    for first, pairs in zip(starts, infos):
        for i, info in pairs:
            out[first + i] = info
    return out
