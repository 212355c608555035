"""Chooses the compiled core or its pure-Python reference, once, at import.

``STEPLEDGER_PUREPYTHON=1`` forces the reference, as ``MSGPACK_PUREPYTHON``
does for msgpack. Both write byte-identical ledgers.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from stepledger.format.schema import ENV_MEMORY_LIMIT, ENV_PUREPYTHON

if TYPE_CHECKING:  # a type checker sees the compiled core's stub (_core.pyi); the fallback has the same API
    from stepledger import _core as _impl
elif os.environ.get(ENV_PUREPYTHON, "") not in ("", "0"):
    from stepledger import _fallback as _impl
else:
    try:
        from stepledger import _core as _impl
    except ImportError:
        from stepledger import _fallback as _impl

IMPLEMENTATION = _impl.IMPLEMENTATION
StreamBuffer = _impl.StreamBuffer
EventRecorder = _impl.EventRecorder
VectorRecorder = _impl.VectorRecorder
blake2b64 = _impl.blake2b64
digest_leaves = _impl.digest_leaves
digest_rows = _impl.digest_rows
reward_bits = _impl.reward_bits
reward_bits_array = _impl.reward_bits_array
first_difference = _impl.first_difference
set_memory_limit = _impl.set_memory_limit
memory_limit = _impl.memory_limit
memory_in_use = _impl.memory_in_use
account = _impl.account
set_memory_in_use = _impl.set_memory_in_use
set_deadline = _impl.set_deadline
deadline = _impl.deadline
MISSING_DIGEST = _impl.MISSING_DIGEST
INVALID_DIGEST = _impl.INVALID_DIGEST
WITHHELD_DIGEST = _impl.WITHHELD_DIGEST

if os.environ.get(ENV_MEMORY_LIMIT):
    set_memory_limit(int(os.environ[ENV_MEMORY_LIMIT]))
