"""``RepeatAction``: TorchRL's ``frame_skip`` as a Gymnasium wrapper, so that it can go inside ``LedgerEnv``."""

from typing import Any

import gymnasium as gym

__all__ = ["RepeatAction"]


class RepeatAction(gym.Wrapper):
    """Steps the env with each action ``skip`` times, or until the episode ends, and returns the last step's
    observation, flags and info with the sum of the rewards: what TorchRL's ``GymWrapper(frame_skip=k)`` does
    (``GymLikeEnv._step``). There it happens outside the ledger, which then holds k steps for each step a batch
    brings; inside ``LedgerEnv`` (``LedgerEnv(RepeatAction(env, k), ...)``) the ledger holds the step the
    trainer gets."""

    def __init__(self, env, skip):
        if isinstance(skip, bool) or not isinstance(skip, int) or skip < 1:
            raise ValueError("RepeatAction: skip must be a positive int (the steps an action is repeated), got %r"
                             % (skip,))
        super().__init__(env)
        self.skip = skip

    def step(self, action):
        reward: Any = 0  # summed as TorchRL sums it: Python's + on what the env returns
        for _ in range(self.skip):
            obs, r, terminated, truncated, info = self.env.step(action)
            reward = reward + r
            if terminated or truncated:
                break
        return obs, reward, terminated, truncated, info
