"""Tianshou support: both sides of the boundary for its vector envs and its Collector.

Needs the ``[tianshou]`` extra: ``pip install "plugrl-stepledger[tianshou]"``.

- env side: ``ledger_env_fns(make_env, n, directory)`` (or ``LedgerEnvFn``)
  gives the ``env_fns`` of ``DummyVectorEnv``, ``SubprocVectorEnv`` or
  ``ShmemVectorEnv``: ``LedgerEnv`` around each env, in its worker, with its
  index;
- trainer side: ``LedgerCollector``, a ``Collector`` that records the
  transitions its replay buffer hands out.

docs/TIANSHOU.md says where each side reads and what it checks.
"""

try:
    import tianshou  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a venv without Tianshou
    raise ImportError("stepledger.tianshou needs Tianshou: pip install \"plugrl-stepledger[tianshou]\" "
                      "(or pip install tianshou)") from exc

from .collector import LedgerCollector
from .envs import LedgerEnvFn, ledger_env_fns

__all__ = ["LedgerCollector", "LedgerEnvFn", "ledger_env_fns"]
