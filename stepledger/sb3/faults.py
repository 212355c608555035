"""SB3's fault injector: ``FaultyVecEnv``, between an SB3 VecEnv and ``LedgerVecEnv``.

It drives the library-free ``stepledger.faults.FaultEngine``; docs/FAULTS.md has the faults and doses.
"""

import numpy as np
from stable_baselines3.common.vec_env import VecEnvWrapper

from stepledger.faults.engine import TRAINER_SIDE_FAULTS, FaultEngine, Injector
from stepledger.recording.batches import copy_value as _copy
from stepledger.recording.batches import row as _row
from stepledger.recording.batches import set_row as _set_row


class FaultyVecEnv(Injector, VecEnvWrapper):
    """Injects one boundary fault on the trainer side of an SB3 VecEnv.

    It goes between the VecEnv and LedgerVecEnv:
    ``LedgerVecEnv(FaultyVecEnv(venv, "reward:swap"), path)``. Final-obs
    faults change ``terminal_observation``; flag faults set ``dones``
    and ``TimeLimit.truncated`` (and a terminal observation where a step
    becomes an end). Arguments as for FaultyEnv.
    """

    def __init__(self, venv, fault, dose="one", at=10, target=0, seed=0, record=None):
        super().__init__(venv)
        self.engine = FaultEngine(fault, dose, at, target, seed, record, self.action_space,
                                  allowed=TRAINER_SIDE_FAULTS, owner="FaultyVecEnv")

    def reset(self):
        obs = self.venv.reset()
        for i in range(self.num_envs):
            self.engine.reset(i, _row(obs, i))
        return obs

    def step_async(self, actions):
        changed = self.engine.actions([actions[i] for i in range(self.num_envs)], [True] * self.num_envs)
        if changed:
            actions = np.array(actions, copy=True)
            for i, a in changed.items():
                actions[i] = a
        self.venv.step_async(actions)

    def step_wait(self):
        obs, rewards, dones, infos = self.venv.step_wait()
        n, ended = self.num_envs, np.array(dones, dtype=bool)
        truncs = [bool(d and infos[i].get("TimeLimit.truncated", False)) for i, d in enumerate(ended)]
        terms = [bool(d) and not truncs[i] for i, d in enumerate(ended)]
        # the obs each step ended on: an ended env's is its terminal_observation
        ends_on = [infos[i].get("terminal_observation") if d else _row(obs, i) for i, d in enumerate(ended)]
        changed = self.engine.steps([(ends_on[i], rewards[i], terms[i], truncs[i]) for i in range(n)], [True] * n)
        sent = obs
        if changed:
            sent = _copy(obs)
            rewards, dones, infos = np.array(rewards, copy=True), np.array(dones, copy=True), list(infos)
            for i, (o, r, term, trunc) in changed.items():
                rewards[i], info = r, dict(infos[i])
                if o is not ends_on[i] and ended[i]:
                    info["terminal_observation"] = o
                elif o is not ends_on[i]:
                    _set_row(sent, i, o)
                if (term, trunc) != (terms[i], truncs[i]):
                    info["TimeLimit.truncated"] = trunc and not term
                    if (term or trunc) and not ended[i]:  # a step made an end: its obs is the final obs
                        info["terminal_observation"] = _copy(_row(obs, i))
                    elif not (term or trunc) and o is not None:  # an end made a step: the final obs goes on
                        _set_row(sent, i, o)
                    dones[i] = term or trunc
                infos[i] = info
        for i in np.flatnonzero(ended):
            self.engine.reset(int(i), _row(obs, int(i)))
        return sent, rewards, dones, infos
