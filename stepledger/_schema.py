"""The facts of the ledger format, defined once and imported everywhere else.

Field names, column names and dtypes, event kinds, the format version and the
marker messages of the digest live here. ``docs/FORMAT.md`` describes the same
facts for readers in other languages.
"""

FORMAT_NAME = "stepledger"
FORMAT_VERSION = 1

# Event kinds, stored in the ``kind`` column.
KIND_RESET = 0
KIND_STEP = 1
KIND_NAMES = {KIND_RESET: "reset", KIND_STEP: "step"}

# The columns each recorder keeps in memory, one entry per event, in this order.
# 1 + 8 + 8 + 8 + 1 + 1 = 27 bytes an event.
EVENT_COLUMNS = (
    ("kind", "|u1"),
    ("h_obs", "<u8"),
    ("h_act", "<u8"),
    ("h_rew", "<u8"),
    ("terminated", "|b1"),
    ("truncated", "|b1"),
)
# Position columns, derived from ``kind`` when a ledger file is written.
POSITION_COLUMNS = (
    ("episode", "<i8"),
    ("step", "<i8"),
)
FILE_COLUMNS = EVENT_COLUMNS + POSITION_COLUMNS
COLUMN_DTYPES = dict(FILE_COLUMNS)
EVENT_COLUMN_NAMES = tuple(name for name, _ in EVENT_COLUMNS)
FILE_COLUMN_NAMES = tuple(name for name, _ in FILE_COLUMNS)
BYTES_PER_EVENT = 27

# Other members of a ledger file.
META_MEMBER = "meta"
STREAM_INDEX_MEMBER = "env_index"
STREAM_OFFSETS_MEMBER = "offsets"
VALUES_MEMBER = "values_{field}_{leaf}"  # field is "obs" or "act"

# The fields compare reports, in report order, and the column behind each.
FIELDS = ("kind", "action", "obs", "reward", "terminated", "truncated")
FIELD_COLUMNS = {
    "kind": "kind",
    "action": "h_act",
    "obs": "h_obs",
    "reward": "h_rew",
    "terminated": "terminated",
    "truncated": "truncated",
}

SIDES = ("env", "trainer")
REWARD_DTYPES = ("float32", "float64")

# Digests are the first 8 bytes of an unkeyed BLAKE2b with digest_size=8,
# read little-endian (see docs/FORMAT.md for the message layout).
DIGEST_SIZE = 8
# Messages that no encoded value can produce: encoded leaves start with the
# length of their dtype tag (2 or 3), these start with a zero byte.
MISSING_MESSAGE = b"\x00missing"  # a value the trainer never received
INVALID_MESSAGE = b"\x00invalid"  # a value that cannot be cast to its space
# The action and reward fields of a reset event hold this.
NO_DIGEST = 0

# Environment variables.
ENV_PUREPYTHON = "STEPLEDGER_PUREPYTHON"
ENV_MEMORY_LIMIT = "STEPLEDGER_MEMORY_LIMIT"
DEFAULT_MEMORY_LIMIT = 64 * 1024 * 1024

# Live mode: the token LedgerEnv(live=True) attaches to each event's info.
# Little-endian: version u8, env index u32, event counter u64, episode i64,
# step i64, kind u8, h_obs u64, h_act u64, h_rew u64, flags u8 (bit 0
# terminated, bit 1 truncated as stored). 55 bytes, a plain immutable value
# that Gymnasium's info merging and pickling carry unchanged.
TOKEN_KEY = "stepledger"
TOKEN_VERSION = 1
TOKEN_FORMAT = "<BIQqqBQQQB"
TOKEN_SIZE = 55
