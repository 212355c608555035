"""The facts of the ledger format, defined once and imported everywhere else.

Field names, column names and dtypes, event kinds, the format version and the
marker messages of the digest live here. ``docs/FORMAT.md`` describes the same
facts for readers in other languages.
"""

import struct
from typing import Any

import numpy as np

FORMAT_NAME = "stepledger"
# 2: each file says which run and which writer it belongs to and how it ended (the
# META_* keys below), and merged spill segments cover a range (META_THROUGH).
# Version 1 files, which have none of these, are read as before.
FORMAT_VERSION = 2

# Event kinds, stored in the ``kind`` column.
KIND_RESET = 0
KIND_STEP = 1
KIND_NAMES = {KIND_RESET: "reset", KIND_STEP: "step"}

# The columns each recorder keeps in memory, one entry per event, in this order.
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
# The bytes an event takes in memory: the sizes of its columns' dtypes (1 + 8 + 8 + 8 + 1 + 1).
BYTES_PER_EVENT = sum(np.dtype(dtype).itemsize for _, dtype in EVENT_COLUMNS)

# How a final ledger's members are deflated (0: stored), by member, with ISA-L
# (the optional [isal] extra) or zlib alone. Digests of observations and actions
# do not compress; flags, kinds and counters compress well and fast at level 1.
# float32 reward bits are half zeros: ISA-L deflates them to about 4 bytes an
# event at 250 MB/s and more. zlib alone manages about 30 to 55 MB/s on them, 3
# to 5 s for 16M events, so without isal they are stored (8 bytes an event; the
# file stays the same format, readable by either), and the episode and step
# counters, which zlib's level 1 deflates slowly (its fast matcher takes short
# matches on 8-byte counters: the step counter at 4 s for 16M events), take zlib's
# level 2 (about 0.1 byte an event; the episode counter 35% and the step counter
# 25% faster than at levels 1 and 3, and no larger). float64 reward bits are
# stored with either; spill segments store every member.
COLUMN_LEVELS = {
    "isal": {"kind": 1, "h_obs": 0, "h_act": 0, "h_rew": 1, "terminated": 1, "truncated": 1,
             "episode": 1, "step": 1},
    "zlib": {"kind": 1, "h_obs": 0, "h_act": 0, "h_rew": 0, "terminated": 1, "truncated": 1,
             "episode": 2, "step": 2},
}
FLOAT64_REWARD_LEVEL = 0

# Other members of a ledger file.
META_MEMBER = "meta"
STREAM_INDEX_MEMBER = "env_index"
STREAM_OFFSETS_MEMBER = "offsets"
VALUES_MEMBER = "values_{field}_{leaf}"  # field is "obs" or "act"
MEMBER_LEVEL = 6  # meta, env_index and offsets
VALUES_LEVEL = 1  # kept values (values_*, encoded_*)
# Kept values that do not fit the space's fixed leaves (a value of another shape than its
# space's): their leaf encoding, the digest's message, concatenated over the file's events
# (uint8), and its length at each event (uint32; 0 where the value is in values_* instead).
ENCODED_MEMBER = "encoded_{field}"
ENCODED_LENGTH_MEMBER = "encoded_{field}_len"

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
WITHHELD_MESSAGE = b"\x00withheld"  # a final observation the library never gave the trainer, as it says it does
# The action and reward fields of a reset event hold this.
NO_DIGEST = 0

# Meta keys of a recording's settings: the same in every file of it (checked by META_KEYS below).
META_FORMAT = "format"                # FORMAT_NAME
META_FORMAT_VERSION = "format_version"
META_SIDE = "side"                    # one of SIDES
META_REWARD_DTYPE = "reward_dtype"    # one of REWARD_DTYPES
META_OBS_SPACE = "observation_space"  # space descriptions (docs/FORMAT.md, section 6)
META_ACT_SPACE = "action_space"
META_KEEP_VALUES = "keep_values"
META_VERSION = "version"              # the writer's stepledger version
META_AUTORESET = "autoreset_mode"     # trainer side; the values are vector.py's
# What both sides must record alike, for their ledgers to compare.
SETTINGS = (META_REWARD_DTYPE, META_OBS_SPACE, META_ACT_SPACE)

# Meta keys that describe one file of a recording, not the recording's settings: two
# env ledgers of one run agree on everything else.
META_RUN = "run"            # the run: the trainer ledger's writer id, handed to the env side
META_WRITER = "writer"      # this recording's own id (16 hex digits)
META_STARTED = "started"    # when the recording began (Unix time, seconds)
META_UPDATED = "updated"    # when this file was written (Unix time, seconds)
META_STATE = "state"        # how the recording had ended when this file was written: STATES
META_HOST = "host"          # the writer's host name
META_PID = "pid"            # the writer's process id
# the writer's start time (Linux: clock ticks since boot, field 22 of /proc/PID/stat), so that a later
# process given the same pid is not taken for it (stepledger/processes.py); absent where it cannot be read
META_PID_START = "pid_start"
META_POSITION = "position"  # env side: its position in the trainer's vector env, as the trainer told it
META_SEGMENT = "segment"    # spill segments: the first segment number this file holds
META_THROUGH = "through"    # merged spill segments: the last segment number it holds
META_POSSIBLE_AGENTS = "possible_agents"  # the agent of each stream of a multi-agent env ledger


def agent_names(agents):
    """META_POSSIBLE_AGENTS's value for ``agents``: each agent id as a string (RLlib's may be ints: OpenSpielEnv's
    players are 0 and 1), in their order."""
    return [str(a) for a in agents]
META_RECORDED_BY = "recorded_by"  # multi-agent env side: the class that recorded it (LedgerParallelEnv, LedgerAECEnv)
# trainer side: the wrappers it found between the two ledgers when it was built (stepledger.stack), each
# {"name": class name, "deliberate": bool, "changes": [fields] or null, "where": "inside" | "around LedgerEnv"}
META_WRAPPERS = "wrappers"
# trainer side, a recorder that sees slices of its envs' streams (one of several learners): {"i": [[offset,
# row], ...]}, each pair saying that stream i's rows from ``row`` on are the env's events from ``offset`` on
# (an event's offset: its place in the env's whole stream); compare stitches an env's slices by them
META_FRAGMENTS = "fragments"
# env side: this recording is a copy of a recorded env (docs/INDICES.md), made as COPIES says; it records
# env-N.copy-{random}.npz, never the original's env-N.npz
META_COPY = "copy"
COPY_PICKLED = "pickled"  # an unpickled or deep-copied LedgerEnv
COPY_REBUILT = "rebuilt"  # built while another LedgerEnv of this process recorded env-N.npz (env.spec.make(), ...)
COPIES = (COPY_PICKLED, COPY_REBUILT)
# how a recording's run was cut (docs/ENDINGS.md): the exception that escaped a step or reset it recorded, or
# that ended its program (its class name: "KeyboardInterrupt" for a Ctrl-C), and, in a file written on SIGTERM, the writer's parent process
# then (pid and start time), which compare holds against the trainer ledger's writer: the trainer's process
# ending its vector env's workers, not a SIGTERM from outside
META_INTERRUPTED_BY = "interrupted_by"
META_PARENT_PID = "parent_pid"
META_PARENT_START = "parent_pid_start"
# What the reader notes in a ledger's meta of its mapped part (never written in a file): the events read
# from it, those it left out because the machine rebooted since (its pages may not have reached the disk),
# and rings that need a segment that is missing.
META_MAPPED = "mapped_events"
META_REBOOTED = "rebooted_events"
META_MAP_GAP = "mapped_gap"
META_DIED = "died_during"  # {env index: {"event", "episode", "step", "action" (a text, or None)}}
PER_FILE_META = (META_RUN, META_WRITER, META_STARTED, META_UPDATED, META_STATE, META_HOST, META_PID,
                 META_PID_START, META_POSITION, META_SEGMENT, META_THROUGH, META_FRAGMENTS, META_COPY,
                 META_INTERRUPTED_BY, META_PARENT_PID, META_PARENT_START,
                 META_MAPPED, META_REBOOTED, META_MAP_GAP, META_DIED)

# How a recording had ended when a file of it was written (META_STATE).
STATE_OPEN = "open"                # still recording: written by a periodic spill, flush() or a merge
STATE_CLOSED = "closed"            # close() after a run with no exception out of a step or reset
STATE_INTERRUPTED = "interrupted"  # closed after an exception (Ctrl-C, an error) escaped a step or reset
STATE_EXIT = "exit"                # written as its process exited without close()
STATE_SIGNAL = "signal"            # written when its process got SIGTERM
STATES = (STATE_OPEN, STATE_CLOSED, STATE_INTERRUPTED, STATE_EXIT, STATE_SIGNAL)

# Files next to a ledger while it is written (the reader never reads them as ledgers).
TMP_INFIX = ".tmp-"        # NAME.tmp-{pid}-{pid_start}-{random}: a write in progress, or cut short
LOCK_SUFFIX = ".lock"      # NAME.lock: the process recording NAME (JSON: pid, pid_start, host, writer)
DUPLICATE_INFIX = ".dup-"  # env-3.dup-{writer}.npz: a second recording of env-3.npz at the same time
COPY_INFIX = ".copy-"     # env-3.copy-{random}.npz: a copy of env 3's LedgerEnv (META_COPY)
# env-unindexed-{random}.npz: a LedgerEnv that had no index at its first event (index= not given,
# nor set_index(), nor the trainer side's link); its one stream has the placeholder env_index 0.
UNINDEXED_PREFIX = "env-unindexed-"
# The env side of a batch (stepledger.recording.envbatch.EnvLedger, one process recording envs first .. last of
# a vector env at its own output) writes one file for them all, env-{first}-{last}.npz, with one stream per env
# (env_index first .. last); a batch of one env writes env-{first}.npz. Read as env-N.npz files are.
ENV_FILE_NAME = "env-%d.npz"
BATCH_FILE_NAME = "env-%d-%d.npz"

# The attribute through which the trainer side tells each env-side ledger its run and its
# position in the vector env (the vector env's set_attr, or SB3's env_method).
LINK_ATTR = "stepledger_link"

# Environment variables.
ENV_PUREPYTHON = "STEPLEDGER_PUREPYTHON"
ENV_MEMORY_LIMIT = "STEPLEDGER_MEMORY_LIMIT"
DEFAULT_MEMORY_LIMIT = 64 * 1024 * 1024
# Seconds between periodic spills: a process killed with SIGKILL loses at most the events
# of its last interval (while it steps) plus the time of one write.
ENV_FLUSH_INTERVAL = "STEPLEDGER_FLUSH_INTERVAL"
DEFAULT_FLUSH_INTERVAL = 5.0

# The mapped part of a ledger (format/mapped.py): the events no spill segment holds yet live in a file
# mapped shared into the recording process, on local disk, ``NAME.live-{writer}``, so that they reach the
# file however the process dies. Little-endian. A file header (MAP_HEADER_BYTES: magic, layout version,
# streams, capacity, meta slot size, meta sequence and the two slots' lengths, the boot id of the machine
# that wrote it), two slots for the recording's meta (JSON; the slot ``seq & 1`` is current, written whole
# before seq is bumped), then a region a stream: a header of MAP_STREAM_HEADER bytes (base: the stream's
# events before the first held, which segments hold; end: one past the last whole event, stored after the
# event's bytes, release-ordered; synced: events known on disk, for a machine crash; the env index), then
# the columns as rings of ``capacity`` rows (a power of two), event g at row g % capacity: kind, terminated,
# truncated (1 byte), h_obs, h_act, h_rew (8 bytes).
MAP_INFIX = ".live-"
MAP_MAGIC = b"SLMAP\x00\x00\x01"
MAP_LAYOUT_VERSION = 1
MAP_HEADER_FORMAT = "<8sIIIIQII40s"  # magic, version, streams, capacity, meta slot, meta seq, len0, len1, boot id
MAP_HEADER_BYTES = 4096
MAP_STREAM_HEADER = 256
# base, end, synced, env index; then the env side's step under way: pending (the index of its event + 1,
# stored after the rest: the step never returned while pending == end + 1), the length of its action's
# message (-1: its digest only), unused, the action's digest (when no message); the message at MAP_ACTION_AT
MAP_STREAM_FORMAT = "<QQQqQiiQ"
MAP_BASE, MAP_END, MAP_SYNCED, MAP_PENDING, MAP_ACTION_LEN, MAP_ACTION_DIGEST = 0, 8, 16, 32, 40, 48
MAP_ACTION_AT = 64
MAP_ACTION_BYTES = 128  # the digest message of a small action (one leaf, or a Discrete int), as FORMAT.md §2
MAP_COLUMN_ORDER = ("kind", "terminated", "truncated", "h_obs", "h_act", "h_rew")  # in the region, in order
MAP_PAGE = 4096  # regions and meta slots start on a page
# Bytes of a ledger's mapped part (all its streams): ``STEPLEDGER_MAPPED_BYTES``, 0 for none (today's
# in-memory buffers: a SIGKILL then loses the events since the last spill). Each stream gets a ring of
# at least MAP_MIN_CAPACITY events; a ring half full asks for a spill (in the background).
ENV_MAPPED_BYTES = "STEPLEDGER_MAPPED_BYTES"
DEFAULT_MAPPED_BYTES = 4 << 20
MAP_MIN_CAPACITY = 1024
# For tests: the boot id the reader takes as this machine's (a machine crash, simulated).
ENV_BOOT_ID = "STEPLEDGER_BOOT_ID"
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"

# Live mode: the token LedgerEnv(live=True) attaches to each event's info.
# Little-endian: version u8, env index u32, event counter u64, episode i64,
# step i64, kind u8, h_obs u64, h_act u64, h_rew u64, flags u8 (bit 0
# terminated, bit 1 truncated as stored). 55 bytes, a plain immutable value
# that Gymnasium's info merging and pickling carry unchanged.
TOKEN_KEY = "stepledger"
# With the first event's token, LedgerEnv(live=True) also sends its settings under this key: a JSON
# object (bytes) with reward_dtype, observation_space and action_space (their digest signatures), so the
# trainer side can refuse at the first token when the two sides record differently.
SETTINGS_KEY = "stepledger_settings"
# stepledger.pettingzoo.LedgerParallelEnv(live=True) puts each agent's reset token under a key of its own:
# SuperSuit's vector envs merge the reset's info over the ending step's at an autoreset, and a reset token
# under TOKEN_KEY would overwrite the step's. Its first token's settings also name the env's possible_agents.
RESET_TOKEN_KEY = "stepledger_reset"
TOKEN_VERSION = 1
TOKEN_FIELDS = (
    ("version", "B"),
    ("index", "I"),
    ("counter", "Q"),
    ("episode", "q"),
    ("step", "q"),
    ("kind", "B"),
    ("h_obs", "Q"),
    ("h_act", "Q"),
    ("h_rew", "Q"),
    ("flags", "B"),
)
TOKEN_FORMAT = "<" + "".join(code for _, code in TOKEN_FIELDS)
TOKEN_SIZE = struct.calcsize(TOKEN_FORMAT)
# Where each field of the token starts, and its width, in bytes.
TOKEN_OFFSETS: dict[str, int] = {}
TOKEN_WIDTHS: dict[str, int] = {}
for _name, _code in TOKEN_FIELDS:
    TOKEN_OFFSETS[_name] = sum(TOKEN_WIDTHS.values())
    TOKEN_WIDTHS[_name] = struct.calcsize("<" + _code)
del _name, _code
TOKEN_TERMINATED = 1  # bits of the flags byte
TOKEN_TRUNCATED = 2

# The episode log EpisodeLogTap writes and ``stepledger episodes`` reads: an .npz with arrays
# env (int64), r (float64), l (int64), vstep (int64) and meta (a JSON string, with META_FORMAT
# and META_FORMAT_VERSION as a ledger's).
EPISODE_LOG_FORMAT = "stepledger-episode-log"
EPISODE_LOG_VERSION = 1

# ---------------------------------------------------------------- meta
#
# The keys of the ``meta`` member, checked when a file is opened
# (ledgerfile.LedgerFile, through check_meta below). One line a key:
#   MetaKey(name, type, required on which sides, allowed values, minimum)
# type is one of META_TYPES. A key added after files of this format version
# were written is optional (required=()), so that those files stay readable;
# a key that only one side writes names that side. Keys not listed here are
# kept as they are: a newer writer of the same format version may add some.


class MetaKey:
    __slots__ = ("name", "type", "required", "values", "minimum")

    def __init__(self, name, type, required=SIDES, values=None, minimum=None):
        self.name, self.type, self.required = name, type, tuple(required)
        self.values, self.minimum = values, minimum


META_KEYS = (
    MetaKey(META_FORMAT, "str", values=(FORMAT_NAME,)),
    MetaKey(META_FORMAT_VERSION, "int", minimum=1),
    MetaKey(META_SIDE, "str", values=SIDES),
    MetaKey(META_REWARD_DTYPE, "str", values=REWARD_DTYPES),
    MetaKey(META_OBS_SPACE, "space"),
    MetaKey(META_ACT_SPACE, "space"),
    MetaKey(META_KEEP_VALUES, "bool"),
    MetaKey(META_VERSION, "str"),
    MetaKey(META_AUTORESET, "str", required=()),
    MetaKey(META_SEGMENT, "int", required=(), minimum=0),
    # format version 2: which run and writer a file is of, and how its recording had ended
    MetaKey(META_RUN, "run", required=()),
    MetaKey(META_WRITER, "str", required=()),
    MetaKey(META_STARTED, "number", required=()),
    MetaKey(META_UPDATED, "number", required=()),
    MetaKey(META_STATE, "str", required=(), values=STATES),
    MetaKey(META_HOST, "str", required=()),
    MetaKey(META_PID, "int", required=(), minimum=0),
    MetaKey(META_PID_START, "int", required=(), minimum=0),
    MetaKey(META_POSITION, "int", required=(), minimum=0),
    MetaKey(META_THROUGH, "int", required=(), minimum=0),
    MetaKey(META_COPY, "str", required=(), values=COPIES),
    MetaKey(META_INTERRUPTED_BY, "str", required=()),
    MetaKey(META_PARENT_PID, "int", required=(), minimum=0),
    MetaKey(META_PARENT_START, "int", required=(), minimum=0),
    # multi-agent env side: the agent of each stream, in stream order (stepledger.pettingzoo)
    MetaKey(META_POSSIBLE_AGENTS, "strings", required=()),
    # and the class that recorded it, which compare's hints name (files without it: LedgerParallelEnv's)
    MetaKey(META_RECORDED_BY, "str", required=()),
    # the wrappers the trainer side found between the two ledgers (read by compare's hints only)
    MetaKey(META_WRAPPERS, "wrappers", required=()),
)
META = {key.name: key for key in META_KEYS}

# Reader limits, checked before anything is inflated, so that no file however
# crafted makes a reader hold more than a bounded amount of memory. Event
# columns are streamed in chunks and may be of any length.
MAX_STREAMS = 1 << 16  # streams (envs) in one file
MAX_MEMBERS = 4096  # members in one file
MAX_DIRECTORY_BYTES = 4 << 20  # the ZIP central directory
MAX_META_CHARS = 4 << 20  # the meta JSON, in characters (the member is 4 bytes a character)
MAX_SPACE_DEPTH = 32  # nesting of Dict and Tuple spaces
MAX_LEAVES = 1024  # leaves of one space
MAX_NPY_HEADER = 64 << 10  # a member's .npy header
MAX_ENCODED_VALUE = 64 << 20  # one kept value stored as its encoding (encoded_obs, encoded_act)


class MetaProblem(Exception):
    """What is wrong with one meta key: ``key`` (a dotted path) and ``problem``."""

    def __init__(self, key, problem):
        super().__init__("%s: %s" % (key, problem))
        self.key, self.problem = key, problem


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x):
    return isinstance(x, (int, float))  # bool is an int: a bool Box's bounds are true and false


def _json_type(x):
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(x), type(x).__name__)


_TYPE_CHECKS = {
    "str": (lambda x: isinstance(x, str), "a string"),
    "run": (lambda x: x is None or isinstance(x, str), "a string or null"),
    "int": (_is_int, "an integer"),
    "bool": (lambda x: isinstance(x, bool), "true or false"),
    "number": (lambda x: _is_number(x) and not isinstance(x, bool), "a number"),
    "object": (lambda x: isinstance(x, dict), "an object"),
    "space": (lambda x: isinstance(x, dict), "a space description (an object)"),
    "strings": (lambda x: isinstance(x, list) and all(isinstance(v, str) for v in x), "a list of strings"),
    "any": (lambda x: True, "any JSON value"),
    "wrappers": (lambda x: isinstance(x, list) and all(isinstance(w, dict) and isinstance(w.get("name"), str)
                                                       for w in x), "a list of wrapper descriptions"),
}
META_TYPES = tuple(_TYPE_CHECKS)


def check_meta(meta):
    """Check a parsed meta against META_KEYS; raise MetaProblem for the first key that is wrong.

    Returns {"observation_space": leaves, "action_space": leaves}, each a list
    of (dtype name, shape) in leaf order (see space_leaves).
    """
    if not isinstance(meta, dict):
        raise MetaProblem("meta", "is %s, not an object" % _json_type(meta))
    side = meta.get("side")
    leaves = {}
    for key in META_KEYS:
        if key.name not in meta:
            if side in key.required or (key.required == SIDES and side not in SIDES):
                raise MetaProblem(key.name, "is missing")
            continue
        value = meta[key.name]
        ok, wanted = _TYPE_CHECKS[key.type]
        if not ok(value):
            raise MetaProblem(key.name, "is %s, expected %s" % (_short_json(value), wanted))
        if key.values is not None and value not in key.values:
            raise MetaProblem(key.name, "is %s, expected one of %s" % (
                _short_json(value), ", ".join(_short_json(v) for v in key.values)))
        if key.minimum is not None and value < key.minimum:
            raise MetaProblem(key.name, "is %s, expected at least %s" % (_short_json(value), key.minimum))
        if key.type == "space":
            leaves[key.name] = space_leaves(value, key.name)
    return leaves


def _short_json(x, limit=60):
    import json
    try:
        text = json.dumps(x, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_LEAF_SPACES = ("Box", "Discrete", "MultiDiscrete", "MultiBinary")
_NUMERIC_KINDS = "biuf"


def space_leaves(desc, key="space", depth=0, out=None):
    """The leaves of a space description (see docs/FORMAT.md, section 6): [(dtype name, shape)].

    In the order recorders flatten values: Dict keys sorted, Tuple elements in
    order. Raises MetaProblem naming the key path of the first thing wrong.
    """
    if depth == 0:
        # A space holding a variable one (Text, Sequence, Graph, OneOf) has no fixed leaves.
        found = _space_leaves(desc, key, 0, [])
        return [] if None in found else found
    return _space_leaves(desc, key, depth, [] if out is None else out)


_VARIABLE_SPACES = ("Text", "Sequence", "Graph", "OneOf")


def _space_leaves(desc, key, depth, out):
    if depth > MAX_SPACE_DEPTH:
        raise MetaProblem(key, "spaces nested deeper than %d" % MAX_SPACE_DEPTH)
    if not isinstance(desc, dict):
        raise MetaProblem(key, "is %s, expected a space description (an object)" % _short_json(desc))
    kind = desc.get("type")
    if kind in _VARIABLE_SPACES:
        out.append(None)  # values of varying size: no fixed leaf
        if kind == "Text":
            for name in ("min_length", "max_length"):
                if not _is_int(desc.get(name)) or desc[name] < 0:
                    raise MetaProblem("%s.%s" % (key, name), "is %s, expected a non-negative integer"
                                      % _short_json(desc.get(name)))
            if not isinstance(desc.get("charset"), str):
                raise MetaProblem(key + ".charset", "is %s, expected a string" % _short_json(desc.get("charset")))
        elif kind == "Sequence":
            if not isinstance(desc.get("stack"), bool):
                raise MetaProblem(key + ".stack", "is %s, expected true or false" % _short_json(desc.get("stack")))
            _space_leaves(desc.get("space"), key + ".space", depth + 1, out)
        elif kind == "Graph":
            for name in ("node_space", "edge_space"):
                sub = desc.get(name)
                if sub is None and name == "edge_space" and name in desc:
                    continue
                if not isinstance(sub, dict) or sub.get("type") not in ("Box", "Discrete"):
                    raise MetaProblem("%s.%s" % (key, name), "is %s, expected a Box or Discrete description%s"
                                      % (_short_json(sub), " or null" if name == "edge_space" else ""))
                _space_leaves(sub, "%s.%s" % (key, name), depth + 1, out)
        else:  # OneOf
            subs: Any = desc.get("spaces")  # JSON, checked before use
            if not isinstance(subs, list) or not subs:
                raise MetaProblem(key + ".spaces", "is %s, expected a non-empty list" % _short_json(subs))
            for i, sub in enumerate(subs):
                _space_leaves(sub, "%s.spaces[%d]" % (key, i), depth + 1, out)
        if len(out) > MAX_LEAVES:
            raise MetaProblem(key, "more than %d leaves" % MAX_LEAVES)
        return out
    if kind == "Dict" or kind == "Tuple":
        subs = desc.get("spaces")
        if kind == "Dict" and not isinstance(subs, dict) or kind == "Tuple" and not isinstance(subs, list):
            raise MetaProblem(key + ".spaces", "is %s, expected %s" % (
                _short_json(subs), "an object" if kind == "Dict" else "a list"))
        items = sorted(subs.items()) if kind == "Dict" else enumerate(subs)
        for k, sub in items:
            _space_leaves(sub, "%s.spaces[%s]" % (key, _short_json(k)), depth + 1, out)
            if len(out) > MAX_LEAVES:
                raise MetaProblem(key, "more than %d leaves" % MAX_LEAVES)
        return out
    if kind not in _LEAF_SPACES:
        raise MetaProblem(key + ".type", "is %s, expected one of Box, Discrete, MultiDiscrete, MultiBinary, Dict, "
                                         "Tuple, Text, Sequence, Graph, OneOf" % _short_json(kind))

    def field(name, check, wanted, required=True):
        if name not in desc:
            if required:
                raise MetaProblem("%s.%s" % (key, name), "is missing")
            return None
        value = desc[name]
        if not check(value):
            raise MetaProblem("%s.%s" % (key, name), "is %s, expected %s" % (_short_json(value), wanted))
        return value

    def shape_of(name):
        shape = field(name, lambda v: isinstance(v, list) and len(v) <= 32 and all(_is_int(d) and 0 <= d < 1 << 40
                                                                                   for d in v),
                      "a list of at most 32 non-negative integers")
        return tuple(shape)

    def dtype_of():
        name = field("dtype", lambda v: isinstance(v, str), "a NumPy dtype name")
        try:
            dtype = np.dtype(name)
        except (TypeError, ValueError):
            dtype = None
        if dtype is None or dtype.kind not in _NUMERIC_KINDS or dtype.name != name:
            raise MetaProblem(key + ".dtype", "is %s, expected a numeric NumPy dtype name" % _short_json(name))
        return name

    def nested_ints(v, d=0):
        return d < 32 and (_is_int(v) or isinstance(v, list) and all(nested_ints(x, d + 1) for x in v))

    if kind == "Discrete":
        field("n", lambda v: _is_int(v) and v >= 1, "a positive integer")
        field("start", _is_int, "an integer", required=False)
        out.append(("int64", ()))
    elif kind == "MultiDiscrete":
        nvec = field("nvec", lambda v: isinstance(v, list) and nested_ints(v), "a (nested) list of integers")
        field("start", nested_ints, "a (nested) list of integers", required=False)
        try:
            shape = np.asarray(nvec, dtype=np.int64).shape
        except (ValueError, OverflowError):
            raise MetaProblem(key + ".nvec", "is not a rectangular list of integers") from None
        out.append((dtype_of(), tuple(int(d) for d in shape)))
    else:  # Box, MultiBinary
        shape = shape_of("shape")
        dtype = dtype_of()
        if kind == "Box":
            size = 1
            for d in shape:
                size *= d
            for bound in ("low", "high"):
                field(bound, lambda v: _is_number(v) or isinstance(v, list) and len(v) == size
                      and all(_is_number(x) for x in v), "a number or a list of %d numbers" % size, required=False)
        out.append((dtype, shape))
    return out
