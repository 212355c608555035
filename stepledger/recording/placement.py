"""What sits between a trainer-side ledger and the vector env it records.

The trainer-side ledger must be innermost: a wrapper between it and the
vector env that changes values on purpose (normalizes, transforms, clips,
rescales or stacks them) makes every env differ from its first events.
``value_changing_wrappers`` walks the chain inside the ledger and names them;
``outer_env_wrappers`` names those wrapped around LedgerEnv in the envs of a
vector env that holds them in-process (SyncVectorEnv, SB3's DummyVecEnv), where
the single-env forms (FrameStackObservation has no other) sit between the two
ledgers too. The ledgers warn once at construction (``check_wrappers=False``
silences it).
"""

import warnings

from stepledger import wording

# Known by class name, so that SB3 need not be imported to recognise its wrappers.
_BY_NAME = {
    # Gymnasium (vector and single-env forms share these names)
    "NormalizeObservation", "NormalizeReward", "TransformObservation", "TransformReward", "TransformAction",
    "VectorizeTransformObservation", "VectorizeTransformReward", "VectorizeTransformAction",
    "ClipAction", "ClipReward", "RescaleAction", "RescaleObservation", "FrameStackObservation",
    "DtypeObservation", "FlattenObservation", "GrayscaleObservation", "ResizeObservation", "ReshapeObservation",
    "FilterObservation",
    # Stable-Baselines3
    "VecNormalize", "VecFrameStack", "VecTransposeImage",
}


def _changes_values(env):
    try:
        import gymnasium as gym
        bases = (gym.vector.VectorObservationWrapper, gym.vector.VectorActionWrapper,
                 gym.vector.VectorRewardWrapper)
        if isinstance(env, bases):
            return True
    except (ImportError, AttributeError):
        pass
    return any(cls.__name__ in _BY_NAME for cls in type(env).__mro__[:-1])


def value_changing_wrappers(env):
    """Names of the wrappers in ``env``'s chain (outermost first) known to change values on purpose.

    Follows Gymnasium's ``.env`` and SB3's ``.venv`` down to the vector env.
    """
    return [type(e).__name__ for e in _chain(env) if _changes_values(e)]


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


def outer_env_wrappers(env):
    """Names of the wrappers known to change values that sit around LedgerEnv in the envs of ``env``'s
    vector env, where it holds them in this process (``.envs``: SyncVectorEnv, DummyVecEnv); in the
    order first found. Envs without a LedgerEnv in their chain are not looked into."""
    subs = None
    for e in _chain(env):
        subs = own_attr(e, "envs")
    names = []
    for sub in subs if isinstance(subs, (list, tuple)) else ():
        above: list[str] = []
        for e in _chain(sub):
            if any(cls.__name__ == "LedgerEnv" for cls in type(e).__mro__):
                names += [n for n in above if n not in names]
                break
            if _changes_values(e):
                above.append(type(e).__name__)
    return names


def warn_inner_wrappers(env, owner, check_wrappers=True):
    """Warn once (UserWarning) when ``env`` holds wrappers that change values on purpose: inside the
    trainer-side ledger, or around LedgerEnv in the envs of an in-process vector env."""
    if not check_wrappers:
        return []
    names = value_changing_wrappers(env)
    outer = outer_env_wrappers(env)
    if names:
        warnings.warn(wording.inner_wrapper_warning(owner, names), UserWarning, stacklevel=3)
    if outer:
        warnings.warn(wording.outer_env_wrapper_warning(owner, outer), UserWarning, stacklevel=3)
    return names + [n for n in outer if n not in names]


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
