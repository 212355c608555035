"""Recording: everything that writes a ledger while a run goes on.

``recording`` holds a ledger's life (``Recording``: buffers, spills, the final file), writing through its
place (``stepledger.format.place``: a local path or a URL, one interface); ``hooks`` the process hooks that keep
it through signals, exits and forks, and ``attend()``, which the wrappers call when a spill is due;
``spiller`` the open recordings of the process and the thread that spills the idle ones; ``values`` the kept
values; ``checks`` the checks of a ledger's arguments; ``trainer`` the trainer-side engine (``TrainerLedger``),
which every library's trainer-side adapter drives; ``adapters`` what every adapter shares (``EnvAdapter``,
``TrainerAdapter``: ledger_path, live_faults, flush, close, the interrupted mark); ``live`` the live check's tokens; ``placement`` the
warnings about where a ledger sits among wrappers; ``batches`` the rows of a vector env's batch.
"""

from stepledger.recording.checks import check_directory, check_path, check_reward_dtype, check_writable, flush_interval
from stepledger.recording.hooks import attend, spill_everything
from stepledger.recording.recording import Recording, segment_name
from stepledger.recording.spiller import open_recording
from stepledger.recording.values import ValueStore

__all__ = ["Recording", "ValueStore", "attend", "check_directory", "check_path", "check_reward_dtype",
           "check_writable", "flush_interval", "open_recording", "segment_name", "spill_everything"]
