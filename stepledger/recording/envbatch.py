"""The env side's engine for a batch of envs: ``EnvLedger`` records a vector env at its own output.

The counterpart of ``TrainerLedger`` for simulators that step many envs in one call and have no single env
to wrap (Gymnasium's ``CartPoleVectorEnv``, EnvPool, JAX and GPU simulators). It records, in one process,
each env's stream as the simulator produced it, right where the batch left the simulator, and writes one
env-side file for the whole batch, ``env-{first}-{last}.npz`` (docs/FORMAT.md, section 5), which compare
reads as it reads ``env-N.npz`` files. The bookkeeping of each autoreset convention is the core's
(``VectorRecorder``, shared with the trainer side): a whole batch is digested in one core call, with no
Python loop over envs.

Conventions, as the simulator has them (``autoreset_mode``):

- "next_step" (``CartPoleVectorEnv``, EnvPool): the step after an episode's end is that env's reset; its
  action is ignored, and it is recorded as a reset.
- "same_step" with the final observation where the caller has it (``step(..., final_obs)``);
  ``step_done_flags`` for simulators that give one done flag and no truncation.
- sub-batches by env id (EnvPool's async mode, ``batch_size < num_envs``): ``actions_at``, ``step_at``,
  ``reset_at``, each with the env ids of its rows.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from stepledger.format import schema as S
from stepledger.format import storage
from stepledger.recording.checks import check_directory, check_path
from stepledger.recording.trainer import TrainerLedger

if TYPE_CHECKING:
    import gymnasium as gym

__all__ = ["EnvLedger", "batch_file_name"]


def batch_file_name(first: int, num_envs: int) -> str:
    """The env-side file of envs ``first`` .. ``first + num_envs - 1``: env-{first}-{last}.npz (env-{first}.npz
    for one env)."""
    if num_envs == 1:
        return S.ENV_FILE_NAME % first
    return S.BATCH_FILE_NAME % (first, first + num_envs - 1)


class EnvLedger(TrainerLedger):
    """Records a batch of envs on the env side, as the simulator returned them.

    Example, a JAX or NumPy simulator stepped by hand (next-step autoreset)::

        >>> import numpy as np, gymnasium as gym
        >>> from stepledger import EnvLedger
        >>> led = EnvLedger("ledger", 4, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2),
        ...                 autoreset_mode="next_step")
        >>> led.reset(np.zeros((4, 3), np.float32))
        >>> led.actions(np.array([0, 1, 1, 0]))          # before the simulator steps
        >>> led.step(np.ones((4, 3), np.float32), np.ones(4), np.zeros(4, bool), np.zeros(4, bool))
        >>> led.close()  # writes ledger/env-0-3.npz; compare it with the trainer side's file

    The calls are ``TrainerLedger``'s: ``reset(obs, mask)``, ``actions(batch)`` before the simulator
    steps, then ``step(obs, rewards, terminated, truncated, final_obs)`` (or ``step_results(results)``, a
    vector env's whole step in one core call); ``step_done_flags(obs, rewards, dones, final_obs)`` for a
    simulator that gives one done flag (each end recorded as a termination); ``actions_at``, ``step_at``
    and ``reset_at`` for a sub-batch of envs named by their ids (next-step autoreset). Values are never read
    after a call returns. Arrays that expose the array interface or DLPack on the CPU (torch tensors, JAX
    arrays) are read where they are, without a copy (docs/BATCHED.md).

    Args:
        directory: where the env-side file goes (a path or an fsspec URL): ``env-{first}-{last}.npz``.
        num_envs: how many envs the batch holds.
        observation_space, action_space: one env's spaces.
        autoreset_mode: "next_step" or "same_step" (or a Gymnasium AutoresetMode): the simulator's own.
        first: the env index of the batch's first env (default 0): a process that steps envs 256 .. 511 of
            a run passes 256.
        reward_dtype, keep_values, flush_interval: as for ``TrainerLedger``; the same on both sides.
    """

    _SIDE = "env"

    def __init__(self, directory: str | os.PathLike[str], num_envs: int,
                 observation_space: gym.spaces.Space[Any], action_space: gym.spaces.Space[Any], *,
                 autoreset_mode: Any, first: int = 0, reward_dtype: Any = np.float32, keep_values: bool = False,
                 flush_interval: float | None = None, owner: str = "EnvLedger") -> None:
        directory = check_path(directory, owner, "directory")
        if isinstance(first, bool) or not isinstance(first, (int, np.integer)) or first < 0:
            raise ValueError("%s: first must be a non-negative integer (the env index of the batch's first env), "
                             "got %r" % (owner, first))
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError("%s: num_envs must be a positive integer, got %r" % (owner, num_envs))
        if autoreset_mode is None:
            raise ValueError("%s: autoreset_mode is needed: 'next_step' or 'same_step', the simulator's own" % owner)
        if not storage.is_remote(directory):
            if os.path.splitext(directory)[1].lower() == ".npz" and not os.path.isdir(directory):
                raise ValueError("%s: directory %r looks like a ledger file; give the directory the env-side file "
                                 "goes to (%s is written inside it)" % (owner, directory,
                                                                       batch_file_name(int(first), int(num_envs))))
            check_directory(directory, owner)
        self.first = int(first)
        self.directory = directory
        super().__init__(storage.join(directory, batch_file_name(self.first, int(num_envs))), num_envs,
                         observation_space, action_space, autoreset_mode=autoreset_mode,
                         reward_dtype=reward_dtype, keep_values=keep_values, flush_interval=flush_interval,
                         owner=owner, final_obs_name="its final observation (final_obs[{i}])")
        self._no_truncation = np.zeros(self.num_envs, dtype=np.bool_)

    def _file_streams(self, n, streams):
        return range(self.first, self.first + n)

    def link(self, run: str | None) -> None:
        """The trainer side's run (its ledger's ``run``), so that compare pairs the two by it."""
        if self.recording is not None:
            self.recording.link(run, None)

    def step_done_flags(self, obs: Any, rewards: Any, dones: Any, final_obs: Any = None) -> None:
        """A step of a simulator that gives one done flag per env and no truncation (Brax, gymnax): each
        end is recorded as a termination, under the engine's autoreset mode (same-step: ``final_obs[i]``,
        the final observation where the caller has it)."""
        self.step(obs, rewards, dones, self._no_truncation, final_obs)
