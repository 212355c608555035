"""SuperSuit issue 232 on the installed supersuit (tests/pettingzoo/test_table_one.py runs it on 3.9.0 in a side
venv and on the dev venv's): MarkovVectorEnv (pettingzoo_env_to_vec_env_v1) lost each episode's final
observation, the reset's info overwriting the step's, where infos[i]["terminal_observation"] should hold it.

    python tests/pettingzoo/table_one_232.py DIR

simple_spread (3 agents, a time limit of 5 cycles) through LedgerParallelEnv, SuperSuit's vectoriser and its
Gymnasium form of 2 copies, LedgerSuperSuitVecEnv on the trainer side; random actions over 3 time limits.
Prints the versions and the report.
"""

import os
import sys
import warnings

import numpy as np
import supersuit as ss

try:
    from mpe2 import simple_spread_v3
except ImportError:  # pettingzoo < 1.25 ships the MPE envs itself
    from pettingzoo.mpe import simple_spread_v3

from stepledger import compare
from stepledger.pettingzoo import LedgerParallelEnv, LedgerSuperSuitVecEnv

import pettingzoo

d = sys.argv[1]
warnings.simplefilter("ignore")
env = LedgerParallelEnv(simple_spread_v3.parallel_env(N=3, max_cycles=5), d)
venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 2, num_cpus=0, base_class="gymnasium")
venv = LedgerSuperSuitVecEnv(venv, os.path.join(d, "trainer.npz"))
venv.reset(seed=0)
space = venv.action_space
space.seed(0)
for _ in range(16):
    venv.step(np.stack([space.sample() for _ in range(venv.num_envs)]))
venv.close()
print("supersuit", ss.__version__ if hasattr(ss, "__version__") else "?", "pettingzoo", pettingzoo.__version__)
print(compare(d, os.path.join(d, "trainer.npz")))
