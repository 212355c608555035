"""The wrappers stepledger knows by name, library by library: the one list.

A wrapper found between the two ledgers is one of three kinds:

- it changes values on purpose (it normalizes, transforms, clips, rescales,
  stacks, converts, delays or ends episodes): listed below with the report
  fields it changes, or declared so by the user (``deliberate_wrappers=`` on
  the trainer-side ledgers, or ``stepledger_changes_values`` on its class);
- it only watches (records statistics or video, checks the API, renders):
  listed below with no fields, or declared ``stepledger_changes_values =
  False``; it is not named;
- anything else (a wrapper of the user's own, a plain ``VectorWrapper``):
  named as a wrapper on the checked side, whose differences are its doing.

``stepledger.stack`` (the placement warning) and ``stepledger.wording`` (the
hints of compare) read this table; nothing else lists these names. A class
counts when it, or a class it derives from, is defined in the library's
package under one of these names. The table imports nothing.
"""

OBS, ACTION, REWARD, TRUNCATED = "obs", "action", "reward", "truncated"
SPACE = "space"  # not a report field: it changes the observation space (its shape, dtype or structure) too

# {package: {class (or function) name: the fields it changes on purpose, () if it only watches}},
# in the order hints name them (the first few of a field are its examples): the commonest first.
KNOWN = {
    # gymnasium 1.4: gymnasium/wrappers/*.py and gymnasium/wrappers/vector/*.py (the single-env and the
    # vector forms share their names)
    "gymnasium": {
        "NormalizeObservation": (OBS,), "TransformObservation": (OBS,), "FrameStackObservation": (OBS, SPACE),
        "VectorizeTransformObservation": (OBS,), "RescaleObservation": (OBS,), "DtypeObservation": (OBS, SPACE),
        "FlattenObservation": (OBS, SPACE), "FilterObservation": (OBS, SPACE), "GrayscaleObservation": (OBS, SPACE),
        "ResizeObservation": (OBS, SPACE), "ReshapeObservation": (OBS, SPACE), "DiscretizeObservation": (OBS, SPACE),
        "DelayObservation": (OBS,), "TimeAwareObservation": (OBS, SPACE), "AddRenderObservation": (OBS, SPACE),
        "NormalizeReward": (REWARD,), "TransformReward": (REWARD,), "ClipReward": (REWARD,),
        "VectorizeTransformReward": (REWARD,),
        "ClipAction": (ACTION,), "RescaleAction": (ACTION,), "TransformAction": (ACTION,),
        "VectorizeTransformAction": (ACTION,), "DiscretizeAction": (ACTION,), "StickyAction": (ACTION,),
        "RepeatAction": (ACTION,),
        "TimeLimit": (TRUNCATED,),
        # several at once: frames skipped (their rewards summed), or episodes restarted on their own
        "MaxAndSkipObservation": (OBS, REWARD), "AtariPreprocessing": (OBS, REWARD), "Autoreset": (OBS, REWARD),
        # array conversions: every value arrives as another array type
        "ArrayConversion": (OBS, ACTION, REWARD), "NumpyToTorch": (OBS, ACTION, REWARD),
        "JaxToNumpy": (OBS, ACTION, REWARD), "JaxToTorch": (OBS, ACTION, REWARD),
        # they only watch, or change the info or the render frames alone
        "RecordEpisodeStatistics": (), "OrderEnforcing": (), "PassiveEnvChecker": (), "RecordVideo": (),
        "HumanRendering": (), "RenderCollection": (), "AddWhiteNoise": (), "ObstructView": (), "DictInfoToList": (),
    },
    # stable-baselines3 2.x: stable_baselines3/common/vec_env/
    "stable_baselines3": {
        "VecNormalize": (OBS, REWARD), "VecFrameStack": (OBS, SPACE), "VecTransposeImage": (OBS, SPACE),
        "VecExtractDictObs": (OBS, SPACE),
        "VecMonitor": (), "VecCheckNan": (), "VecVideoRecorder": (),
    },
    # SuperSuit 3.x: its wrappers are made by functions, around LedgerParallelEnv (multi-agent hints name
    # these); its SB3 adapter only translates the vector env's calls
    "supersuit": {
        "normalize_obs_v0": (OBS,), "observation_lambda_v0": (OBS,), "frame_stack_v1": (OBS, SPACE),
        "agent_indicator_v0": (OBS, SPACE), "flatten_v0": (OBS, SPACE), "dtype_v0": (OBS, SPACE),
        "color_reduction_v0": (OBS, SPACE),
        "resize_v1": (OBS, SPACE), "delay_observations_v0": (OBS,), "max_observation_v0": (OBS,),
        "clip_reward_v0": (REWARD,), "reward_lambda_v0": (REWARD,), "frame_skip_v0": (OBS, REWARD),
        "clip_actions_v0": (ACTION,), "scale_actions_v0": (ACTION,), "action_lambda_v1": (ACTION,),
        "sticky_actions_v0": (ACTION,),
        "SB3VecEnvWrapper": (),
    },
}

# The class attribute a wrapper declares itself with: True (it changes values on purpose), a tuple of the
# fields it changes on purpose, or False (it only watches: passes every value through unchanged).
DECLARE_ATTR = "stepledger_changes_values"

DELIBERATE, WATCHES, UNKNOWN = "deliberate", "watches", "unknown"


def known(cls):
    """(package, name, fields) of the first class in ``cls``'s MRO the table lists, or None."""
    for c in cls.__mro__[:-1]:
        package = (getattr(c, "__module__", "") or "").partition(".")[0]
        fields = KNOWN.get(package, {}).get(c.__name__)
        if fields is not None:
            return package, c.__name__, fields
    return None


def names_changing(field, package):
    """The names the table lists for ``package`` that change ``field`` on purpose, in table order."""
    return [name for name, fields in KNOWN[package].items() if field in fields]
