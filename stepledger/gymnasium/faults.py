"""Gymnasium's fault injectors: ``FaultyEnv`` on the env side, ``FaultyVectorEnv`` on the trainer side.

Both drive the library-free ``stepledger.faults.FaultEngine``; docs/FAULTS.md has the faults and doses.
"""

from __future__ import annotations

import os
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from stepledger.faults.engine import ENV_SIDE_FAULTS, TRAINER_SIDE_FAULTS, FaultEngine, Injector
from stepledger.gymnasium.vector import NEXT_STEP, final_obs_at, resolve_autoreset_mode
from stepledger.recording.batches import copy_value as _copy
from stepledger.recording.batches import row as _row
from stepledger.recording.batches import set_row as _set_row


class FaultyEnv(Injector, gym.Wrapper):
    """Injects one boundary fault on the env side, outside LedgerEnv in the worker.

    Example: ``FaultyEnv(LedgerEnv(env, "ledger", index=i), "reward:f16", index=i)``.

    Args:
        env: the env, already wrapped in LedgerEnv.
        fault: one of ``ENV_SIDE_FAULTS``.
        index: the env's index in the vector env; None (a stack whose LedgerEnv is given its index
            later, by ``set_index`` or the trainer side's link): the LedgerEnv's index at the first reset.
        dose: "one", "all" or a fraction.
        at: with dose "one", the first step counter (over the env's life) that may be hit.
        target: with dose "one", the env that is hit.
        seed: the fault generator's seed, for fractional doses.
        record: a JSON file to write where the fault first changed a value.
    """

    def __init__(self, env: gym.Env[Any, Any], fault: str, index: int | None = None, dose: str | float = "one",
                 at: int = 10, target: int = 0, seed: int = 0, record: str | os.PathLike[str] | None = None) -> None:
        super().__init__(env)
        self.index = None if index is None else int(index)
        self.engine = FaultEngine(fault, dose, at, target, seed, record, env.action_space,
                                  allowed=ENV_SIDE_FAULTS, owner="FaultyEnv")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        if self.index is None:  # the LedgerEnv inside has its index once it was reset
            try:
                index = self.env.get_wrapper_attr("stepledger_index")
            except AttributeError:
                index = None
            if index is None:
                raise ValueError("FaultyEnv: no index= and no LedgerEnv inside that knows its index at the first "
                                 "reset; give FaultyEnv index= or the LedgerEnv its index")
            self.index = int(index)
        self.engine.reset(self.index, obs)
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        index: int = self.index  # type: ignore[assignment]  # None only before the first reset, which sets it
        filled = self.engine.fill(index)
        if filled is not None:
            return filled[0], filled[1], False, False, {}
        action = self.engine.action(index, action)
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self.engine.step(index, obs, reward, terminated, truncated) + (info,)


class FaultyVectorEnv(Injector, gym.vector.VectorWrapper):
    """Injects one boundary fault on the trainer side of a Gymnasium vector env.

    It goes between the vector env and LedgerVectorEnv:
    ``LedgerVectorEnv(FaultyVectorEnv(envs, "obs:swap"), path)``. Under
    NEXT_STEP it leaves autoreset steps alone; under SAME_STEP, final-obs
    faults change ``info["final_obs"]``. Arguments as for FaultyEnv, and
    ``autoreset_mode`` as LedgerVectorEnv reads it.
    """

    def __init__(self, env: gym.vector.VectorEnv, fault: str, dose: str | float = "one", at: int = 10,
                 target: int = 0, seed: int = 0, record: str | os.PathLike[str] | None = None,
                 autoreset_mode: Any = None) -> None:
        super().__init__(env)
        self.engine = FaultEngine(fault, dose, at, target, seed, record, self.single_action_space,
                                  allowed=TRAINER_SIDE_FAULTS, owner="FaultyVectorEnv")
        self.mode = resolve_autoreset_mode(env, autoreset_mode, "FaultyVectorEnv")
        self.next_step = self.mode == NEXT_STEP

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:

        mask = options.get("reset_mask") if options else None
        obs, info = self.env.reset(seed=seed, options=options)
        for i in range(self.num_envs):
            if mask is None or mask[i]:
                self.engine.reset(i, _row(obs, i))
        return obs, info

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        n, engine, next_step = self.num_envs, self.engine, self.next_step
        stepping = [not (next_step and engine.awaiting_reset(i)) for i in range(n)]
        changed = engine.actions([_row(actions, i) for i in range(n)], stepping)
        if changed:
            actions = _copy(actions)
            for i, a in changed.items():
                _set_row(actions, i, a)
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        ended = np.logical_or(terminated, truncated)
        # the obs each step ended on: under SAME_STEP an ended env's is in info["final_obs"]
        ends_on = [final_obs_at(info, i) if ended[i] and not next_step else _row(obs, i) for i in range(n)]
        changed = engine.steps([(ends_on[i], rewards[i], terminated[i], truncated[i]) for i in range(n)], stepping)
        sent = obs
        if changed:
            sent, info = _copy(obs), dict(info)
            rewards, terminated, truncated = (np.array(x, copy=True) for x in (rewards, terminated, truncated))
            for i, (o, r, te, tr) in changed.items():
                rewards[i], terminated[i], truncated[i] = r, te, tr
                if next_step or not ended[i]:
                    _set_row(sent, i, o)
                    if not next_step and (te or tr):  # a step made an end: its obs is the final obs
                        _set_final(info, i, _copy(o), n)
                elif not (te or tr):  # an end made a step: the final obs goes on as its obs, not the reset obs
                    if o is not None:
                        _set_row(sent, i, o)
                elif o is not ends_on[i]:
                    _set_final(info, i, o, n)
        for i in range(n):
            if not stepping[i] or ended[i] and not next_step:
                engine.reset(i, _row(obs, i))
        return sent, rewards, terminated, truncated, info


def _set_final(info: dict[str, Any], i: int, value: Any, n: int) -> None:

    """Make ``value`` env i's final obs in ``info``, copying ``final_obs`` and its mask rather than editing them.

    ``final_obs`` is an object array, or a dict of arrays where a vector env's
    info merging split a dict obs.
    """
    finals, mask = info.get("final_obs"), info.get("_final_obs")
    info["final_obs"] = finals = np.full(n, None, dtype=object) if finals is None else _copy(finals)
    info["_final_obs"] = mask = np.zeros(n, dtype=bool) if mask is None else np.array(mask, copy=True)
    _set_row(finals, i, value)
    mask[i] = True
    if isinstance(finals, dict):  # the split form's masks, one a key
        for k in value:
            if "_%s" % k in finals:
                finals["_%s" % k][i] = True
