"""A pytest plugin that runs TorchRL's own Gym, batched-env and collector tests with wrappers inserted.

Loaded into a separate pytest run (``-p trl_upstream_plugin``) by test_torchrl_upstream.py. Before TorchRL's
tests are collected it changes two things, in every mode but ``bare``:

- every Gymnasium env a TorchRL ``GymWrapper`` or ``GymEnv`` is given (``GymWrapper._build_env``; one env, not a
  Gymnasium vector env) is wrapped outermost: ``LedgerEnv(env, directory, index=i)`` in mode ``ledger``, and
  the TorchRL env gets ``LedgerGymMixin`` (the index in each step, seeding beneath the ledger) as
  ``ledger_env_fns`` builds it, and a ``frame_skip`` of k becomes Gymnasium's ``RepeatAction(env, num_repeats=k)`` inside the ledger
  (LedgerGymWrapper refuses it outside); a plain ``gym.Wrapper`` in mode ``passthrough``. A GymEnv built by a batched
  env's factory (``SerialEnv``, ``ParallelEnv``: ``BatchedEnvBase.__init__``, in the worker for ParallelEnv) is
  env i of that batched env's directory; any other has a directory of its own, index 0;
- in mode ``ledger``, a ``Collector`` records the trainer side of each batch its ``iterator`` yields
  (``LedgerCollector``'s reading: ``stepledger.torchrl.collector``), into ``directory/trainer-<k>.npz``, where
  its env is one batched env (or one GymEnv) with a ledger in every sub-env, seen through no transform that
  changes values (``StepCounter`` without a limit and ``InitTracker`` only add keys), with no ``postproc`` and
  no ``split_trajs``. Other collectors are logged with the reason and not recorded (both modes alike).

Environment: ``STEPLEDGER_UPSTREAM_MODE`` and ``STEPLEDGER_UPSTREAM_OUT``. It writes ``outcomes.json`` (test id
-> passed, failed or skipped), ``envs.jsonl`` (each ledgered env: test, directory, index), ``collectors.jsonl``
(test, directory and trainer file, or why not recorded) and ``errors.jsonl`` (a batch the trainer side could
not read: must stay empty) there.
"""

import itertools
import json
import os

import gymnasium as gym
from upstream_outcomes import Outcomes  # tests/, on the inner pytest's path

MODE = os.environ.get("STEPLEDGER_UPSTREAM_MODE", "bare")
OUT = os.environ.get("STEPLEDGER_UPSTREAM_OUT", ".")
_CURRENT = {"test": None}
_COUNTER = itertools.count()
_OUTCOMES = Outcomes()
_STATE = {"installed": False, "next": None}  # next: (directory, index) for the GymEnv a factory is building
_BOOKS = []  # the open trainer sides, closed at the end of their test


def _log(name, **entry):
    with open(os.path.join(OUT, name), "a") as f:
        f.write(json.dumps(dict(entry, test=_CURRENT["test"], pid=os.getpid())) + "\n")


def _new_directory(kind):
    return os.path.join(OUT, "ledgers", "%s-%d-%05d" % (kind, os.getpid(), next(_COUNTER)))


class _EnvSide:
    """A batched env's factory i: builds the user's env with (directory, i) as the next GymEnv's ledger.
    Picklable (ParallelEnv sends it to its worker, where it installs the patches first)."""

    def __init__(self, fn, directory, index):
        # not "fn": TorchRL's CloudpickleWrapper copies this object's __dict__ onto itself (functools.update_wrapper),
        # and an attribute fn would replace the wrapper's own, which it calls
        self.make, self.directory, self.index = fn, directory, index

    def __call__(self, **kwargs):
        _install_env_side()
        before, _STATE["next"] = _STATE["next"], (self.directory, self.index)
        try:
            return self.make(**kwargs)
        finally:
            _STATE["next"] = before


_LEDGERED = {}
_PREFIX = "Ledgered_"


def _ledgered_class(cls):
    """``cls`` (GymWrapper, GymEnv, ...) with LedgerGymMixin first, as LedgerGymWrapper is GymWrapper; named in
    this module (``Ledgered_GymEnv``), so that an env pickled to a worker is found there."""
    from stepledger.torchrl.envs import LedgerGymMixin
    if cls not in _LEDGERED:
        name = _PREFIX + cls.__name__
        _LEDGERED[cls] = type(cls)(name, (LedgerGymMixin, cls), {"__module__": __name__, "__qualname__": name})
    return _LEDGERED[cls]


def __getattr__(name):  # unpickling a Ledgered_ class in a process that has not made it yet
    if name.startswith(_PREFIX):
        import torchrl.envs.libs.gym as trl_gym
        cls = getattr(trl_gym, name[len(_PREFIX):], None)
        if cls is not None:
            return _ledgered_class(cls)
    raise AttributeError(name)


def _install_env_side():
    if _STATE["installed"] or MODE == "bare":
        return
    _STATE["installed"] = True
    from torchrl.envs.batched_envs import BatchedEnvBase
    from torchrl.envs.libs.gym import GymWrapper

    real_build = GymWrapper._build_env

    def build(self, env, *args, **kwargs):
        given, _STATE["next"] = _STATE["next"], None  # only the first GymEnv a factory builds is its env
        vector = isinstance(env, gym.vector.VectorEnv) or getattr(self, "_constructor_kwargs", {}).get("num_envs")
        skip = getattr(self, "wrapper_frame_skip", 1)
        if isinstance(env, gym.Env) and not vector:
            if MODE == "ledger":
                from stepledger import LedgerEnv
                directory, index = given or (_new_directory("gym"), 0)
                if skip > 1:  # LedgerGymMixin refuses TorchRL's frame_skip (outside the ledger): repeat inside it
                    env = gym.wrappers.RepeatAction(env, num_repeats=skip)
                    self.wrapper_frame_skip = 1
                env = LedgerEnv(env, directory, index=index)
                self._stepledger_index = index
                self._stepledger_dir = directory
                self.__class__ = _ledgered_class(type(self))
                _log("envs.jsonl", dir=directory, index=index, batched=given is not None)
            else:
                env = gym.Wrapper(env)
        return real_build(self, env, *args, **kwargs)

    GymWrapper._build_env = build
    real_init = BatchedEnvBase.__init__

    def init(self, num_workers=None, create_env_fn=None, *args, **kwargs):
        from torchrl.envs import EnvCreator
        if create_env_fn is not None and num_workers is not None:
            fns = create_env_fn if isinstance(create_env_fn, (list, tuple)) else [create_env_fn] * num_workers
            if not any(isinstance(fn, EnvCreator) for fn in fns):  # an EnvCreator is left as it is
                directory = _new_directory("batched")
                self._stepledger_dir = directory
                create_env_fn = [_EnvSide(fn, directory, i) for i, fn in enumerate(fns)]
        real_init(self, num_workers, create_env_fn, *args, **kwargs)

    BatchedEnvBase.__init__ = init


def _plain_transforms(env):
    """The env beneath a TransformedEnv whose transforms only add keys, or None (and why)."""
    from torchrl.envs import Compose, InitTracker, StepCounter, TransformedEnv
    while isinstance(env, TransformedEnv):
        transforms = env.transform if isinstance(env.transform, Compose) else [env.transform]
        for t in transforms:
            if isinstance(t, InitTracker) or (isinstance(t, StepCounter) and t.max_steps is None):
                continue
            return None, "a transform that changes values or ends episodes: %s" % type(t).__name__
        env = env.base_env
    return env, None


def _recordable(collector):
    """(directory, number of envs, (observation space, action space)) for the trainer side of ``collector``, or
    (None, why not)."""
    from torchrl.envs.batched_envs import BatchedEnvBase
    if getattr(collector, "split_trajs", False) or getattr(collector, "postproc", None) is not None:
        return None, "split_trajs or a postproc"
    if getattr(collector, "replay_buffer", None) is not None:
        return None, "a replay_buffer (the collector hands out no batch: LedgerCollector refuses it)"
    if getattr(collector, "trajs_per_batch", None) is not None:
        return None, "trajs_per_batch (batches of whole trajectories)"
    env, why = _plain_transforms(collector.env)
    if env is None:
        return None, why
    if isinstance(env, BatchedEnvBase):
        directory = getattr(env, "_stepledger_dir", None)
        if directory is None:
            return None, "a batched env built from an EnvCreator (its envs' indices are not known)"
        n, (spaces, why) = env.num_workers, _batched_spaces(env)
    else:
        directory = getattr(env, "_stepledger_dir", None)
        n, (spaces, why) = 1, _sub_env(env)
    if spaces is None:
        return None, why
    return (directory, n, spaces), None


def _sub_env(env):
    """((observation space, action space) of the LedgerEnv in one TorchRL env, None) or (None, why not)."""
    from stepledger.torchrl.envs import ledger_inside
    base, why = _plain_transforms(env)
    if base is None:
        return None, "in a sub-env, " + why
    ledger = ledger_inside(getattr(base, "_env", None))
    if ledger is None:
        return None, "an env without a ledger (%s)" % type(base).__name__
    return (ledger.observation_space, ledger.action_space), None


def _batched_spaces(env):
    """As ``_sub_env`` for every env of a SerialEnv, or for ParallelEnv an env its factory 0 builds here (with
    a ledger of its own), then closes."""
    from torchrl.envs import SerialEnv
    if isinstance(env, SerialEnv) and getattr(env, "_envs", None):
        found = [_sub_env(e) for e in env._envs]
        return next((f for f in found if f[0] is None), found[0])
    fn = env.create_env_fn[0]
    fn = fn.make if isinstance(fn, _EnvSide) else fn  # not env 0 of the batched env's directory: that is the worker's
    made = fn(**(env.create_env_kwargs[0] if env.create_env_kwargs else {}))
    try:
        return _sub_env(made)
    finally:
        made.close()


def _install_trainer_side():
    from torchrl.collectors import Collector

    from stepledger.recording.trainer import TrainerLedger
    from stepledger.torchrl.collector import _Book

    real_iterator = Collector.iterator

    def iterator(self):
        book = getattr(self, "_stepledger_book", None)
        if book is None:
            what, why = _recordable(self)
            if what is None:
                _log("collectors.jsonl", recorded=False, why=why)
                self._stepledger_book = False
            else:
                directory, n, (obs_space, act_space) = what
                path = os.path.join(directory, "trainer-%d-%05d.npz" % (os.getpid(), next(_COUNTER)))
                ledger = TrainerLedger(path, n, obs_space, act_space, owner="LedgerCollector")
                self._stepledger_book = _Book(ledger, n, obs_space, act_space, False)
                _BOOKS.append(self._stepledger_book)
                _log("collectors.jsonl", recorded=True, dir=directory, trainer=path, n=n)
        book = self._stepledger_book
        for batch in real_iterator(self):
            if book and batch is not None:
                try:
                    book.record(batch)
                except Exception as exc:  # the plugin's failure, not the test's: logged, and the test fails on it
                    _log("errors.jsonl", error="%s: %s" % (type(exc).__name__, exc))
                    _close(book)
                    book = False
            yield batch

    Collector.iterator = iterator


def _close(book):
    if book in _BOOKS:
        _BOOKS.remove(book)
    try:
        book.finish()
        book.ledger.close()
    except Exception as exc:
        _log("errors.jsonl", error="closing: %s: %s" % (type(exc).__name__, exc))


def pytest_configure(config):
    if MODE != "bare":
        _install_env_side()
    if MODE == "ledger":
        _install_trainer_side()


def pytest_runtest_setup(item):
    _CURRENT["test"] = item.nodeid


def pytest_runtest_teardown(item, nextitem):
    for book in list(_BOOKS):
        _close(book)


def pytest_runtest_logreport(report):
    _OUTCOMES.add(report)


def pytest_sessionfinish(session, exitstatus):
    _OUTCOMES.write(OUT)
