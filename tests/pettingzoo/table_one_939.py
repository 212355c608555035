"""PettingZoo issue 939 on the installed pettingzoo (tests/pettingzoo/test_table_one.py runs it on 1.22.3 in a side venv
and on the dev venv's): parallel_to_aec_wrapper cast one-dimensional continuous actions to int.

    python tests/pettingzoo/table_one_939.py DIR [cast]

A turn-based trainer (the agent_iter loop, TurnLedger) drives a parallel env through parallel_to_aec; the env side
is LedgerAECEnv at the bottom of that parallel env (aec_to_parallel of a turn-based env with a Box(-1, 1, (1,))
action space). With "cast", the same int() cast is put between the two (the class, injected on a PettingZoo whose
parallel_to_aec no longer casts). Prints the versions and the report.
"""
import os, sys, warnings
import numpy as np
import pettingzoo
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils import conversions
from stepledger import compare
from stepledger.pettingzoo import LedgerAECEnv, TurnLedger
BaseParallel = getattr(pettingzoo.utils, "BaseParallelWrapper", None) or pettingzoo.utils.BaseParallelWraper

class Steer(AECEnv):
    metadata = {"name": "steer_v0", "is_parallelizable": True}
    def __init__(self):
        super().__init__()
        self.possible_agents = ["car_0", "car_1"]
        self.render_mode = None
        self._o, self._a = spaces.Box(-10, 10, (1,), np.float32), spaces.Box(-1, 1, (1,), np.float32)
    def observation_space(self, agent): return self._o
    def action_space(self, agent): return self._a
    def observe(self, agent): return np.array([self.pos[agent]], np.float32)
    def reset(self, seed=None, options=None, **kwargs):
        self.agents = list(self.possible_agents); self.t = 0
        self.pos = {a: 0.0 for a in self.agents}
        for name in ("rewards", "_cumulative_rewards"): setattr(self, name, {a: 0.0 for a in self.agents})
        self.terminations = {a: False for a in self.agents}; self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}; self.agent_selection = self.agents[0]
    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            return self._was_dead_step(action)
        self._cumulative_rewards[agent] = 0.0
        self.pos[agent] += float(np.asarray(action).reshape(-1)[0])
        self.rewards = {a: 0.0 for a in self.agents}
        self.rewards[agent] = -abs(self.pos[agent])
        k = self.agents.index(agent)
        if k == len(self.agents) - 1:
            self.t += 1
            if self.t >= 4: self.truncations = {a: True for a in self.agents}
        self.agent_selection = self.agents[(k + 1) % len(self.agents)]
        self._accumulate_rewards()
        self._deads_step_first()

d = sys.argv[1]
CAST = len(sys.argv) > 2 and sys.argv[2] == "cast"  # the class injected: the cast of 1.22 put in front of the env
env_side = LedgerAECEnv(Steer(), d, index=0, keep_values=True)
# a parallel env whose agents' actions reach the turn-based env side; parallel_to_aec in front of it, as a
# turn-based trainer meets a parallel env (the plain parallel wrapper stops parallel_to_aec from unwrapping)


class CastActions(BaseParallel):
    """What pettingzoo 1.22's parallel_to_aec_wrapper did to each agent's action (``action = int(action)``)."""

    def step(self, actions):
        return self.env.step({a: int(np.asarray(x).reshape(-1)[0]) for a, x in actions.items()})


parallel = BaseParallel(conversions.aec_to_parallel(env_side))
trainer_env = conversions.parallel_to_aec(CastActions(parallel) if CAST else parallel)
turns = TurnLedger(os.path.join(d, "trainer.npz"), trainer_env.possible_agents,
                   trainer_env.observation_space("car_0"), trainer_env.action_space("car_0"), keep_values=True)
actions = iter([0.7, -0.6, 0.3, 0.9, -0.2, 0.5, 0.1, -0.8] * 4)
trainer_env.reset(seed=0)
for agent in trainer_env.agent_iter():
    obs, reward, term, trunc, info = trainer_env.last()
    turns.observed(agent, obs, reward, term, trunc)
    action = None if term or trunc else np.array([next(actions)], np.float32)
    turns.acted(agent, action)
    trainer_env.step(action)
env_side.close(); turns.close()
print("pettingzoo", pettingzoo.__version__, "numpy", np.__version__)
print(compare(d, os.path.join(d, "trainer.npz")))
