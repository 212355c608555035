"""Recording: everything that writes a ledger while a run goes on.

``recording`` holds a ledger's life (``Recording``: buffers, spills, the final file) and the process hooks
that keep it through signals, exits and forks; ``trainer`` the trainer-side engine (``TrainerLedger``), which
every library's trainer-side adapter drives; ``adapters`` what every adapter shares (``EnvAdapter``,
``TrainerAdapter``: ledger_path, live_faults, flush, close, the interrupted mark); ``live`` the live
check's tokens; ``placement`` the warnings about where a ledger sits among wrappers; ``batches`` the rows
of a vector env's batch.
"""

from stepledger.recording.recording import (Recording, ValueStore, attend, check_directory, check_path,
                                            check_reward_dtype, check_writable, flush_interval, open_recording,
                                            segment_name, spill_everything)

__all__ = ["Recording", "ValueStore", "attend", "check_directory", "check_path", "check_reward_dtype",
           "check_writable", "flush_interval", "open_recording", "segment_name", "spill_everything"]
