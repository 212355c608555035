"""PettingZoo's envs: ``LedgerParallelEnv`` (parallel API) and ``LedgerAECEnv`` (turn-based API) on the env side;
SuperSuit's vector envs and the hand-written ``agent_iter`` loop (``TurnLedger``) on the trainer side.

One folder holds the library's support: ``parallel`` (LedgerParallelEnv, LedgerSuperSuitVecEnv and the
stream helpers, AgentLedger the per-agent streams both APIs share), ``aec`` (LedgerAECEnv, TurnLedger), ``faults`` (FaultyParallelEnv, its injector), ``check`` (check_parallel, ``stepledger check
--trainer supersuit``), ``library`` (its line in ``stepledger.libraries``). Importing this package does not
import PettingZoo; each name does, on first use. docs/MULTIAGENT.md has the whole story.
"""

from typing import TYPE_CHECKING

from stepledger._moved import lazy_face

if TYPE_CHECKING:  # what an editor and a type checker see; at run time each name is imported on first use
    from stepledger.pettingzoo.parallel import PETTINGZOO_NEEDS, LedgerParallelEnv, LedgerSuperSuitVecEnv, agent_streams, index_supersuit_copies, slot_map
    from stepledger.pettingzoo.aec import LedgerAECEnv, TurnLedger
    from stepledger.pettingzoo.faults import FaultyAECEnv, FaultyParallelEnv
    from stepledger.pettingzoo.check import check_parallel, parallel_env_factory

_NAMES = {
    **dict.fromkeys(('LedgerParallelEnv', 'LedgerSuperSuitVecEnv', 'PETTINGZOO_NEEDS', 'agent_streams', 'index_supersuit_copies', 'slot_map'), 'parallel'),
    **dict.fromkeys(('LedgerAECEnv', 'TurnLedger'), 'aec'),
    **dict.fromkeys(('FaultyAECEnv', 'FaultyParallelEnv'), 'faults'),
    **dict.fromkeys(('check_parallel', 'parallel_env_factory'), 'check'),
}
__all__ = sorted(_NAMES)
if not TYPE_CHECKING:  # a type checker sees only the names above: a misspelt one is an error, not Any
    __getattr__, __dir__ = lazy_face(__name__, _NAMES)
