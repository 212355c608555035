"""SB3's vector envs for ``check_boundary`` (``vector="subproc"`` or ``"dummy"``), with ``LedgerVecEnv``."""

from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

from stepledger.gymnasium.check import Vector
from stepledger.sb3.vec_env import LedgerVecEnv

VECTORS = ("subproc", "dummy")


class SB3Vector(Vector):
    """An SB3 VecEnv: LedgerVecEnv around it, seeded through ``seed()`` before a ``reset()`` without arguments."""

    def ledgered(self, venv, path):
        return LedgerVecEnv(venv, path, check_wrappers=False)

    def action_space(self, venv):
        return venv.action_space

    def reset(self, venv, seed):
        venv.seed(seed)
        venv.reset()


def vector(kind, autoreset="next"):
    """SB3's ``SubprocVecEnv`` (``"subproc"``) or ``DummyVecEnv`` (``"dummy"``); ``autoreset`` does not apply
    (SB3 resets in the step that ended an episode)."""
    return SB3Vector(lambda fns: DummyVecEnv(fns) if kind == "dummy" else SubprocVecEnv(fns))
