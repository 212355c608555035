"""Boundary faults on purpose, to prove that a stack's ledgers catch them: the library-free engine and check runner.

``engine`` holds the faults' vocabulary and ``FaultEngine``, which decides where a fault strikes and how it
changes a value; ``check`` runs a check's rollouts and says whether compare located each fault. The injectors
that put the engine into a stack live with their library (``stepledger.gymnasium.faults.FaultyEnv``,
``stepledger.sb3.faults.FaultyVecEnv``, ...); their old names here still work. docs/FAULTS.md has the whole story.
"""

from stepledger._moved import names_of
from stepledger.faults.engine import (AGENT_FAULTS, ENV_SIDE_FAULTS, EVENT_FIELDS, FAULTS, FLAG_FAULTS,
                                      MULTIAGENT_FAULTS, TRAINER_SIDE_FAULTS, VALUE_FIELDS, VALUE_WAYS, Dose,
                                      FaultEngine, Injector, changed_flags, changed_reward, changed_value,
                                      check_fault, needs, read_record, reported_fields, zeros_like)

__all__ = ["AGENT_FAULTS", "ENV_SIDE_FAULTS", "EVENT_FIELDS", "FAULTS", "FLAG_FAULTS", "MULTIAGENT_FAULTS",
           "TRAINER_SIDE_FAULTS", "VALUE_FIELDS", "VALUE_WAYS", "Dose", "FaultEngine", "Injector", "changed_flags",
           "changed_reward", "changed_value", "check_fault", "needs", "read_record", "reported_fields", "zeros_like"]
__getattr__ = names_of(__name__)  # FaultyEnv, FaultyVecEnv, ...: with their library now
