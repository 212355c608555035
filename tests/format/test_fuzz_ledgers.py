"""A mutation fuzzer for the reader (issue 14): real ledgers, mutated in many ways, read by compare, show and read().

It records real ledger pairs (env side and trainer side; with and without
keep_values; clean and differing; float32 and float64 rewards), then, kind
by kind, mutates one file of a pair (or all of them) and runs, each in its
own forked process with a timeout and an address-space limit
(tests/fuzz_server.py): ``stepledger compare ENV_DIR TRAINER``,
``stepledger show FILE`` and ``read(FILE)`` with every column and kept value
read through, and ``stepledger episodes ENV_DIR LOG`` where an env ledger or
the episode log (an .npz as EpisodeLogTap writes) was mutated. For every run it asserts the rules of issue 14:

- it ends within its timeout, and its peak RSS stays under 256 MB;
- exit 0 or 1 (compare and episodes only) with nothing on stderr, or exit 2 with one line
  on stderr; never a traceback, never exit 1 from show or read();
- a mutation that changes nothing that matters (members reordered,
  recompressed, a ZIP comment) keeps the verdict: the same exit code and
  output as the unmutated pair;
- a mutation that damages bytes (flips, truncation, lying sizes and
  offsets) gives exit 2 or the unmutated verdict, never another answer.

CI runs a fixed seed, a fixed number of mutants a kind and a time cap (the first two rounds of
every kind run whatever the time, so that a busy machine tries each kind still). A
longer run with a random seed (the seed is printed, and named in every
failure, to replay it)::

    STEPLEDGER_FUZZ_SEED=random STEPLEDGER_FUZZ_PER_KIND=200 STEPLEDGER_FUZZ_SECONDS=3600 \\
        python -m pytest -s tests/format/test_fuzz_ledgers.py

The table of mutants tried per kind, their outcomes and the worst peak RSS
is printed (``-s`` shows it).
"""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import io
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time
import warnings
import zipfile
import zlib

import numpy as np
import pytest

import hostile_ledgers as H

TESTS_DIR = testpaths.TESTS_DIR
MB = 1 << 20
PEAK_LIMIT = 256 * MB
TIMEOUT = 30.0
BOMB_BYTES = 300 * MB  # more than the bound, so a reader that inflates one whole is caught
GIANT_EVENTS = 6_000_000

_seed = os.environ.get("STEPLEDGER_FUZZ_SEED", "14")
SEED = random.SystemRandom().randrange(1 << 32) if _seed == "random" else int(_seed)
PER_KIND = int(os.environ.get("STEPLEDGER_FUZZ_PER_KIND", "8"))
SECONDS = float(os.environ.get("STEPLEDGER_FUZZ_SECONDS", "75"))
MIN_ROUNDS = 2  # rounds of every kind, whatever the time


# ---------------------------------------------------------------- the commands, in forked children

class Server:
    def __init__(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS_DIR), TESTS_DIR]))
        self.proc = subprocess.Popen([sys.executable, os.path.join(TESTS_DIR, "fuzz_server.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def run(self, request):
        self.proc.stdin.write(json.dumps(dict(request, timeout=TIMEOUT)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the fuzz server died"
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def commands(env_dir, target):
    """The runs for a mutated ``target``: compare, show and read() of a ledger, and episodes for an env
    ledger or the episode log."""
    trainer, log = os.path.join(env_dir, "trainer.npz"), os.path.join(env_dir, "log.npz")
    episodes = ("episodes", {"argv": ["episodes", env_dir, log]})
    if target == log:
        return [episodes]
    runs = [("compare", {"argv": ["compare", env_dir, trainer]}), ("show", {"argv": ["show", target]}),
            ("read", {"read": target})]
    return runs + [episodes] if target != trainer else runs


def write_episode_log(env_dir):
    """The episodes the env ledgers recorded, as an .npz episode log (what EpisodeLogTap writes)."""
    from stepledger.episodes import LOG_FORMAT, recorded_episodes
    rec = recorded_episodes(env_dir)
    np.savez(os.path.join(env_dir, "log.npz"), env=rec.columns["env"], r=rec.columns["ret"],
             l=rec.columns["length"], meta=np.array(json.dumps({"format": LOG_FORMAT, "format_version": 1})))


def normalized(result, directory):
    return (result["code"], result["out"].replace(directory, "DIR"), result["err"].replace(directory, "DIR"))


def broken_rules(name, result):
    """What ``result`` of command ``name`` does against the rules, or None."""
    if result["timeout"]:
        return "did not end within %.0f s" % TIMEOUT
    if result["peak"] > PEAK_LIMIT:
        return "peak RSS %.0f MB" % (result["peak"] / MB)
    err = result["err"].strip()
    if "Traceback" in result["err"] or "Traceback" in result["out"]:
        return "a traceback: %s" % err[-600:]
    # compare exits 3 where an env file cannot be read and the rest agree (the report names the file)
    allowed = {"compare": (0, 1, 2, 3), "episodes": (0, 1, 2)}.get(name, (0, 2))
    if result["code"] not in allowed:
        return "exit %d: %s" % (result["code"], err[-300:])
    if result["code"] == 2 and (not err or "\n" in err):
        return "exit 2 without exactly one line on stderr: %r" % err[:600]
    if result["code"] == 3 and ": not read, so " not in result["out"]:
        return "exit 3 without a line naming the file not read: %r" % result["out"][:600]
    if result["code"] in (0, 1, 3) and err:
        return "exit %d with stderr: %r" % (result["code"], err[:600])
    return None


# ---------------------------------------------------------------- zip surgery

def central_entries(data):
    """Central directory entries: dicts of name, usize, csize, offset and, for each of those three, the
    position and struct format of the field that holds it (the ZIP64 extra field where there is one)."""
    eocd = data.rfind(b"PK\x05\x06")
    count, cd_size, cd_offset = struct.unpack_from("<HII", data, eocd + 10)
    if data[eocd - 20:eocd - 16] == b"PK\x06\x07":
        z64 = struct.unpack_from("<Q", data, eocd - 12)[0]
        count, cd_size, cd_offset = struct.unpack_from("<QQQ", data, z64 + 32)
    out, pos = [], cd_offset
    for _ in range(count):
        csize, usize = struct.unpack_from("<II", data, pos + 20)
        n, e, c = struct.unpack_from("<HHH", data, pos + 28)
        offset = struct.unpack_from("<I", data, pos + 42)[0]
        entry = {"name": data[pos + 46:pos + 46 + n].decode(errors="replace"),
                 "usize": (usize, pos + 24, "<I"), "csize": (csize, pos + 20, "<I"), "offset": (offset, pos + 42, "<I")}
        i, extra_end = pos + 46 + n, pos + 46 + n + e
        while i + 4 <= extra_end:
            tag, size = struct.unpack_from("<HH", data, i)
            if tag == 1:
                at = i + 4
                for field in ("usize", "csize", "offset"):
                    if entry[field][0] == 0xFFFFFFFF and at + 8 <= i + 4 + size:
                        entry[field] = (struct.unpack_from("<Q", data, at)[0], at, "<Q")
                        at += 8
            i += 4 + size
        out.append(entry)
        pos += 46 + n + e + c
    return out


def end_records(data):
    """[(name, position, format)] of the count, size and offset fields of the end records."""
    eocd = data.rfind(b"PK\x05\x06")
    fields = [("count", eocd + 10, "<H"), ("count on this disk", eocd + 8, "<H"), ("cd size", eocd + 12, "<I"),
              ("cd offset", eocd + 16, "<I")]
    if data[eocd - 20:eocd - 16] == b"PK\x06\x07":
        z64 = struct.unpack_from("<Q", data, eocd - 12)[0]
        fields += [("ZIP64 count", z64 + 32, "<Q"), ("ZIP64 count on this disk", z64 + 24, "<Q"),
                   ("ZIP64 cd size", z64 + 40, "<Q"), ("ZIP64 cd offset", z64 + 48, "<Q"),
                   ("ZIP64 record offset", eocd - 12, "<Q")]
    return fields


def patch(data, where, fmt, value):
    value = max(0, min(value, (1 << (8 * struct.calcsize(fmt))) - 1))
    struct.pack_into(fmt, data, where, value)
    return value


def rewrite(path, items, compress=None, levels=None, comment=b""):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of duplicate names, which some mutants want
        with zipfile.ZipFile(path + ".w", "w", allowZip64=True) as zf:
            for i, (name, ctype, data) in enumerate(items):
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = ctype if compress is None else compress[i]
                zf.writestr(info, data, compresslevel=None if levels is None else levels[i])
            zf.comment = comment
    os.replace(path + ".w", path)


def arrays(path):
    with np.load(path, allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def member_bytes(items, name):
    return next(d for n, _, d in items if n == name + ".npy")


def replace_member(items, name, data):
    return [(n, c, data if n == name + ".npy" else d) for n, c, d in items]


def npy(arr):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(arr), allow_pickle=True)
    return buf.getvalue()


def npy_header(descr, shape):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def write_streamed(path, members):
    """A zip of members given as (name, level, chunk iterable), streamed (for bombs and giants)."""
    from stepledger.format.zipwriter import ZipWriter
    with open(path + ".w", "wb") as f:
        w = ZipWriter(f)
        for name, level, chunks in members:
            w.member(name, chunks, level)
        w.close()
    os.replace(path + ".w", path)


def zeros(n, block=8 * MB):
    z = bytes(block)
    while n > 0:
        yield z[:min(n, block)]
        n -= block


# ---------------------------------------------------------------- the mutations

META_KEYS = ["format", "format_version", "side", "reward_dtype", "observation_space", "action_space", "keep_values",
             "version", "autoreset_mode", "segment"]
JSON_VALUES = [None, [], {}, True, False, 0, -1, 1.5, 1e308, float("inf"), float("nan"), "", "x" * 5000, 2 ** 70,
               [1, 2, 3], {"type": "Box"}, {"type": "Box", "shape": [3], "dtype": "float32"}, "float16", "env",
               "trainer", {"a": {"b": {"c": []}}}]
DTYPES = ["|i1", "|u1", "<i4", "<i8", "<u8", "<f4", "<f8", ">i8", ">u8", "|b1", "<c8", "|S8", "<U4", "|V8",
          [("a", "<i4"), ("b", "<f4")], ("<f4", (2,))]
NAN_BITS_32 = [0x7F800001, 0x7FC00123, 0xFFC00000, 0x7F800000, 0xFF800000, 0x80000000, 0x7FBFFFFF]
NAN_BITS_64 = [0x7FF0000000000001, 0x7FF8000000000123, 0xFFF8000000000000, 0x7FF0000000000000, 1 << 63]
NPY_HEADERS = ["{'descr': '<i8', 'fortran_order': False, 'shape': (99999999999,), }",
               "{'descr': '|O', 'fortran_order': False, 'shape': (3,), }",
               "{'descr': '<i8', 'fortran_order': True, 'shape': (3,), }",
               "{'descr': '<i8', 'fortran_order': False, 'shape': (-1,), }",
               "{'descr': '<i8', 'fortran_order': False, 'shape': ((1,),), }",
               "{'descr': [('a', '<i8')], 'fortran_order': False, 'shape': (3,), }",
               "{'descr': '<i8', 'fortran_order': False}", "{{{{", "__import__('os').getcwd()",
               "{'descr': '<i8', 'fortran_order': False, 'shape': (" + "(" * 300 + ")" * 300 + "), }"]


class Mutator:
    """Each method mutates ``path`` (a file of the pair in ``directory``) and returns a short description."""

    def __init__(self, rng):
        self.rng = rng
        self.bombs = 0

    # -- bytes
    def flip(self, path, directory):
        data = bytearray(open(path, "rb").read())
        where = []
        for _ in range(self.rng.choice([1, 1, 2, 4, 16])):
            i = self.rng.randrange(len(data))
            data[i] ^= self.rng.randrange(1, 256)
            where.append(i)
        open(path, "wb").write(bytes(data))
        return "bytes flipped at %s" % where

    def truncate(self, path, directory):
        data = open(path, "rb").read()
        cut = self.rng.randrange(len(data))
        open(path, "wb").write(data[:cut])
        return "cut at %d of %d" % (cut, len(data))

    def junk(self, path, directory):
        data = open(path, "rb").read()
        junk = bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 200)))
        where = self.rng.choice(["append", "prepend", "insert"])
        if where == "append":
            data += junk
        elif where == "prepend":
            data = junk + data
        else:
            i = self.rng.randrange(len(data))
            data = data[:i] + junk + data[i:]
        open(path, "wb").write(data)
        return "%d junk bytes, %s" % (len(junk), where)

    def size_lie(self, path, directory):
        data = bytearray(open(path, "rb").read())
        entry = self.rng.choice(central_entries(bytes(data)))
        field = self.rng.choice(["usize", "csize"])
        true, where, fmt = entry[field]
        value = self.rng.choice([0, 1, true - 1, true + 1, 2 * true, true // 2, 1 << 31, 1 << 40, (1 << 63) - 1,
                                 self.rng.randrange(1 << 32)])
        value = patch(data, where, fmt, value)
        open(path, "wb").write(bytes(data))
        return "%s of %s: %d -> %d" % (field, entry["name"], true, value)

    def offset_lie(self, path, directory):
        data = bytearray(open(path, "rb").read())
        entries = central_entries(bytes(data))
        entry = self.rng.choice(entries)
        offset, where, fmt = entry["offset"]
        other = self.rng.choice(entries)["offset"][0]
        value = self.rng.choice([0, offset + 1, offset - 1, other, len(data), 1 << 62, self.rng.randrange(len(data))])
        value = patch(data, where, fmt, value)
        open(path, "wb").write(bytes(data))
        return "offset of %s: %d -> %d" % (entry["name"], offset, value)

    def end_record(self, path, directory):
        data = bytearray(open(path, "rb").read())
        name, where, fmt = self.rng.choice(end_records(bytes(data)))
        old = struct.unpack_from(fmt, data, where)[0]
        value = self.rng.choice([0, old + 1, old - 1, 1 << 20, 1 << 40, (1 << 63) - 1, self.rng.randrange(len(data))])
        value = patch(data, where, fmt, value)
        open(path, "wb").write(bytes(data))
        return "end record %s: %d -> %d" % (name, old, value)

    # -- members
    def _items(self, path):
        return H.members(path)

    def remove(self, path, directory):
        items = self._items(path)
        k = self.rng.randrange(len(items))
        rewrite(path, items[:k] + items[k + 1:])
        return "removed %s" % items[k][0]

    def rename(self, path, directory):
        items = self._items(path)
        k = self.rng.randrange(len(items))
        name = items[k][0]
        new = self.rng.choice([self.rng.choice(items)[0], name[:-4], name.upper(), "x.npy", name + ".npy",
                               "values_obs_7.npy", "values_obs_x.npy", "../" + name, "\u00e9" + name])
        items[k] = (new,) + items[k][1:]
        rewrite(path, items)
        return "renamed %s to %s" % (name, new)

    def duplicate(self, path, directory):
        items = self._items(path)
        k = self.rng.randrange(len(items))
        copy = items[k]
        if self.rng.random() < 0.5:  # a second member of that name with other content
            copy = (copy[0], copy[1], self.rng.choice(items)[2])
        items.insert(self.rng.randrange(len(items) + 1), copy)
        rewrite(path, items)
        return "duplicated %s" % copy[0]

    def reorder(self, path, directory):
        items = self._items(path)
        self.rng.shuffle(items)
        rewrite(path, items)
        return "order %s" % [n for n, _, _ in items]

    def recompress(self, path, directory):
        items = self._items(path)
        methods = [self.rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]) for _ in items]
        levels = [self.rng.choice([None, 0, 1, 6, 9]) for _ in items]
        rewrite(path, items, compress=methods, levels=levels)
        return "methods %s levels %s" % (methods, levels)

    def comment(self, path, directory):
        items = self._items(path)
        c = bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 300)))
        rewrite(path, items, comment=c)
        return "a ZIP comment of %d bytes" % len(c)

    # -- meta
    def _files(self, path, directory):
        return H.ledger_files(directory, os.path.join(directory, "trainer.npz")) if self.rng.random() < 0.4 \
            else [path]

    def meta_drop(self, path, directory):
        files = self._files(path, directory)
        key = self.rng.choice(sorted(H.meta_of(path)))
        for f in files:
            H.edit_meta(f, drop=(key,))
        return "%s dropped from %d file(s)" % (key, len(files))

    def meta_value(self, path, directory):
        files = self._files(path, directory)
        key = self.rng.choice(sorted(set(H.meta_of(path)) | set(META_KEYS)))
        value = self.rng.choice(JSON_VALUES)
        for f in files:
            H.edit_meta(f, **{key: value})
        return "%s = %s in %d file(s)" % (key, json.dumps(value)[:40], len(files))

    def meta_space(self, path, directory):
        files = self._files(path, directory)
        key = self.rng.choice(["observation_space", "action_space"])
        space = H.meta_of(path)[key]
        node = space
        while isinstance(node.get("spaces"), (dict, list)) and node["spaces"] and self.rng.random() < 0.7:
            subs = node["spaces"]
            node = subs[self.rng.choice(sorted(subs))] if isinstance(subs, dict) else self.rng.choice(subs)
        field = self.rng.choice(sorted(node) + ["type", "shape", "dtype", "spaces", "n", "nvec", "low"])
        if self.rng.random() < 0.3:
            node.pop(field, None)
            what = "dropped"
        else:
            node[field] = self.rng.choice(JSON_VALUES + [[2, 2], [0], ["3"], [-1], "uint8", "object", "<f4"])
            what = "= %s" % json.dumps(node[field])[:40]
        for f in files:
            H.edit_meta(f, **{key: space})
        return "%s.%s %s in %d file(s)" % (key, field, what, len(files))

    def meta_text(self, path, directory):
        good = json.dumps(H.meta_of(path))
        text = self.rng.choice([good[:self.rng.randrange(len(good))], "", "null", "[" * 50000 + "]" * 50000,
                                "1" * 5000, "NaN", '{"format": "stepledger", "format": "x"}', good + "x",
                                good.replace('"', "'"), "\x00" * 10, good.replace("stepledger", "stepledger\udc80")])
        items = replace_member(self._items(path), "meta", npy(np.array(text)))
        rewrite(path, items)
        return "meta text %r" % text[:40]

    def meta_array(self, path, directory):
        text = json.dumps(H.meta_of(path))
        value = self.rng.choice([np.array([text, text]), np.array(text.encode()), np.arange(5), np.array(3.5),
                                 np.array([[text]]), np.array(text, dtype="<U%d" % (len(text) + 10000))])
        rewrite(path, replace_member(self._items(path), "meta", npy(value)))
        return "meta as %s %s" % (value.dtype, value.shape)

    # -- arrays
    def _member(self, path, exclude=("meta",)):
        items = self._items(path)
        names = [n[:-4] for n, _, _ in items if n.endswith(".npy") and n[:-4] not in exclude]
        return items, self.rng.choice(names)

    def dtype(self, path, directory):
        items, name = self._member(path)
        arr = arrays(path)[name]
        dt = self.rng.choice(DTYPES)
        try:
            new = arr.astype(dt)
        except (TypeError, ValueError):
            new = np.zeros(arr.shape, dtype=dt)
        rewrite(path, replace_member(items, name, npy(new)))
        return "%s as %s" % (name, np.dtype(dt))

    def shape(self, path, directory):
        items, name = self._member(path)
        arr = arrays(path)[name]
        how = self.rng.choice(["drop last", "add one", "2-d", "0-d", "empty", "fortran", "double"])
        if how == "drop last":
            new = arr[:-1]
        elif how == "add one":
            new = np.concatenate([arr, arr[-1:]]) if arr.ndim else arr.reshape(1)
        elif how == "2-d":
            new = arr.reshape(arr.shape + (1,))
        elif how == "0-d":
            new = arr.reshape(-1)[:1].reshape(())
        elif how == "empty":
            new = arr.reshape(-1)[:0]
        elif how == "fortran":
            new = np.asfortranarray(np.stack([arr, arr], axis=-1))
        else:
            new = np.concatenate([arr, arr]) if arr.ndim else arr
        rewrite(path, replace_member(items, name, npy(new)))
        return "%s %s: %s -> %s" % (name, how, arr.shape, new.shape)

    def nan_bits(self, path, directory):
        items = self._items(path)
        m = arrays(path)
        candidates = [n for n in m if n == "h_rew" or n.startswith("values_") and m[n].dtype.kind == "f"]
        name = self.rng.choice(candidates)
        arr = m[name].copy()
        flat = arr.reshape(-1)
        for _ in range(self.rng.randrange(1, 5)):
            i = self.rng.randrange(flat.size)
            if flat.dtype == np.float32:
                flat[i:i + 1].view(np.uint32)[0] = self.rng.choice(NAN_BITS_32)
            elif flat.dtype == np.float64:
                flat[i:i + 1].view(np.uint64)[0] = self.rng.choice(NAN_BITS_64)
            else:
                flat[i] = self.rng.choice(NAN_BITS_32 + NAN_BITS_64)
        rewrite(path, replace_member(items, name, npy(arr)))
        return "NaN bit patterns in %s" % name

    def pickle(self, path, directory):
        items, name = self._member(path, exclude=())
        arr = arrays(path)[name]
        obj = np.empty(arr.shape, dtype=object)
        obj.reshape(-1)[:] = [("pickled", i) for i in range(arr.size)]
        rewrite(path, replace_member(items, name, npy(obj)))
        return "%s as pickled objects" % name

    def npy_header(self, path, directory):
        items, name = self._member(path, exclude=())
        data = member_bytes(items, name)
        how = self.rng.choice(["version", "length", "dict", "magic"])
        data = bytearray(data)
        if how == "version":
            data[6:8] = bytes(self.rng.choice([(3, 0), (9, 9), (0, 0), (2, 0)]))
        elif how == "length":
            struct.pack_into("<H", data, 8, self.rng.choice([0, 1, 0xFFFF, len(data)]))
        elif how == "magic":
            data[:6] = b"\x93NUMPZ"
        else:
            text = self.rng.choice(NPY_HEADERS).encode("latin1")
            header = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text) + 1) + text + b"\n"
            hlen = 10 + struct.unpack_from("<H", data, 8)[0]
            data = bytearray(header) + data[hlen:]
        rewrite(path, replace_member(items, name, bytes(data)))
        return "%s header: %s" % (name, how)

    def stream_index(self, path, directory):
        items = self._items(path)
        m = arrays(path)
        ids, offsets = m["env_index"].copy(), m["offsets"].copy()
        how = self.rng.choice(["negative id", "repeated id", "huge id", "offset past end", "offsets backwards",
                               "offset negative", "swap ids", "last offset short", "uint64 max"])
        if how == "negative id":
            ids[0] = -1
        elif how == "repeated id" and len(ids) > 1:
            ids[1] = ids[0]
        elif how == "huge id":
            ids[-1] = (1 << 62) + 1
        elif how == "offset past end":
            offsets[-1] += 5
        elif how == "offsets backwards" and len(offsets) > 2:
            offsets[1] = offsets[-1] + 1
        elif how == "offset negative":
            offsets[0] = -3
        elif how == "swap ids":
            ids = ids[::-1].copy()
        elif how == "last offset short":
            offsets[-1] -= 1
        else:
            ids = ids.astype(np.uint64)
            ids[-1] = np.iinfo(np.uint64).max
        items = replace_member(replace_member(items, "env_index", npy(ids)), "offsets", npy(offsets))
        rewrite(path, items)
        return how

    def bomb(self, path, directory):
        """One member replaced by a deflate stream of 300 MB of zeros, its header lying one way or another."""
        items = self._items(path)
        names = [n[:-4] for n, _, _ in items if n.endswith(".npy")]
        if self.bombs < len(FIRST_BOMBS) and FIRST_BOMBS[self.bombs][0] in names:  # the bombs first
            name, how = FIRST_BOMBS[self.bombs]
            self.bombs += 1
        else:
            name = self.rng.choice([n for n in ("env_index", "offsets", "meta", "kind", "h_obs", "step",
                                                "values_obs_0", "r", "l") if n in names])
            how = self.rng.choice(["header says so", "header says the real size", "directory says the real size"])
        real = np.lib.format.read_array(io.BytesIO(member_bytes(items, name)), allow_pickle=False)
        if name == "meta":
            header = npy_header("<U%d" % (BOMB_BYTES // 4), ()) if how == "header says so" else \
                npy_header(real.dtype.str, ())
        elif how == "header says so":
            header = npy_header(real.dtype.str, (BOMB_BYTES // real.dtype.itemsize,) + real.shape[1:])
        else:
            header = npy_header(real.dtype.str, real.shape)
        members = []
        for n, _, d in items:
            if n == name + ".npy":
                members.append((n, 1, [header] + list(zeros(BOMB_BYTES))))
            else:
                members.append((n, 1 if len(d) > 64 else 0, [d]))
        write_streamed(path, members)
        if how == "directory says the real size":  # the declared size is the honest one, the data is not
            data = bytearray(open(path, "rb").read())
            for entry in central_entries(bytes(data)):
                if entry["name"] == name + ".npy":
                    patch(data, entry["usize"][1], entry["usize"][2], len(header) + real.nbytes)
            open(path, "wb").write(bytes(data))
        return "%s: %s" % (name, how)

    def giant(self, path, directory):
        """A consistent ledger of 6M events of zeros, deflated to a few MB: bounded memory while streamed."""
        from stepledger.format import schema as S
        m = arrays(path)
        meta = H.meta_of(path)
        n_streams = len(m["env_index"])
        n = GIANT_EVENTS
        offsets = np.linspace(0, n, n_streams + 1).astype(np.int64)
        members = [("meta.npy", 6, [npy(m["meta"])]), ("env_index.npy", 6, [npy(m["env_index"])]),
                   ("offsets.npy", 6, [npy(offsets)])]
        for name, dt in S.FILE_COLUMNS:
            dt = np.dtype(dt)
            members.append((name + ".npy", 1, [npy_header(dt.str, (n,))] + list(zeros(n * dt.itemsize))))
        for name, arr in m.items():
            if name.startswith("values_"):
                row = arr.dtype.itemsize * int(np.prod(arr.shape[1:]))
                members.append((name + ".npy", 1, [npy_header(arr.dtype.str, (n,) + arr.shape[1:])]
                                + list(zeros(n * row))))
        write_streamed(path, members)
        return "%d events of zeros, keep_values %s" % (n, meta.get("keep_values"))

    def not_a_ledger(self, path, directory):
        how = self.rng.choice(["random bytes", "empty", "other npz", "zip of text", "text"])
        if how == "random bytes":
            open(path, "wb").write(bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 5000))))
        elif how == "empty":
            open(path, "wb").close()
        elif how == "other npz":
            os.unlink(path)
            np.savez(path, a=np.arange(10), meta=np.array("{}"))
        elif how == "zip of text":
            rewrite(path, [("notes.txt", zipfile.ZIP_DEFLATED, b"hello")])
        else:
            open(path, "w").write("env,r,l\n0,1.0,3\n")
        return how

    def special(self, path, directory):
        how = self.rng.choice(["fifo", "/dev/zero", "directory", "dangling symlink", "symlink loop", "/dev/urandom"])
        os.unlink(path)
        if how == "fifo":
            os.mkfifo(path)
        elif how in ("/dev/zero", "/dev/urandom"):
            os.symlink(how, path)
        elif how == "directory":
            os.mkdir(path)
        elif how == "dangling symlink":
            os.symlink(path + ".nowhere", path)
        else:
            os.symlink(path, path)
        return how

    def spill_segment(self, path, directory):
        """The file, mutated again, as the only spill segment of a ledger killed before its final file."""
        seg_dir = path + ".spill"
        os.makedirs(seg_dir, exist_ok=True)
        seg = os.path.join(seg_dir, "seg-000000.npz")
        shutil.copy(path, seg)
        H.edit_meta(seg, segment=0)
        kind = self.rng.choice(["flip", "truncate", "meta_value", "remove", "dtype", "shape", "reorder"])
        what = getattr(self, kind)(seg, directory)
        if self.rng.random() < 0.5:
            os.unlink(path)
        return "spill segment, %s: %s" % (kind, what)


FIRST_BOMBS = [("env_index", "header says so"), ("offsets", "header says so"), ("meta", "header says so"),
               ("kind", "directory says the real size")]
TARGETS = ["env-1.npz", "trainer.npz", "log.npz"]
NEUTRAL = {"reorder", "recompress", "comment"}
DAMAGE = {"flip", "truncate", "junk", "size_lie", "offset_lie", "end_record"}
KINDS = ["flip", "truncate", "junk", "size_lie", "offset_lie", "end_record", "remove", "rename", "duplicate",
         "reorder", "recompress", "comment", "meta_drop", "meta_value", "meta_space", "meta_text", "meta_array",
         "dtype", "shape", "nan_bits", "pickle", "npy_header", "stream_index", "bomb", "giant", "not_a_ledger",
         "special", "spill_segment"]
EXPENSIVE = {"bomb": 5, "giant": 2, "special": 4}  # mutants a kind at most, in CI (each costs seconds)


# ---------------------------------------------------------------- the test

@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-bases")
    pairs = {
        "clean": H.record_pair(root / "clean"),
        "values-obs-differ": H.record_pair(root / "values-obs", keep_values=True, fault="obs:zero"),
        "values-clean": H.record_pair(root / "values-clean", keep_values=True),
        "f64-reward-differ": H.record_pair(root / "f64", fault="reward:zero", reward_dtype=np.float64),
    }
    for env_dir, _ in pairs.values():
        write_episode_log(env_dir)
    return pairs


def test_mutated_ledgers_never_hurt_the_reader(bases, tmp_path):
    rng = random.Random(SEED)
    server = Server()
    started = time.perf_counter()
    expected = {}  # (base, target) -> {command: normalized result}
    stats = {k: {"tried": 0, "codes": {}, "peak": 0, "worst": ""} for k in KINDS}
    failures = []
    runs = 0
    try:
        for base, (env_dir, trainer) in bases.items():
            for target in TARGETS:
                results = {}
                for name, request in commands(env_dir, os.path.join(env_dir, target)):
                    result = server.run(request)
                    assert broken_rules(name, result) is None and result["code"] == \
                        (1 if name == "compare" and "differ" in base else 0), (base, name, result)
                    results[name] = normalized(result, env_dir)
                expected[base, target] = results
            assert (expected[base, "trainer.npz"]["compare"][0] == 0) == ("differ" not in base)
        mutator = Mutator(rng)
        for round_ in range(PER_KIND):
            for kind in KINDS:
                # the first MIN_ROUNDS rounds always run, so that every kind is tried however busy the
                # machine is; the time cap bounds only the rounds after them
                if round_ >= EXPENSIVE.get(kind, PER_KIND) or (round_ >= MIN_ROUNDS and
                                                                time.perf_counter() - started > SECONDS):
                    continue
                what = None
                for attempt in range(4):  # another base or target where a kind does not apply (the log)
                    base = rng.choice(sorted(bases))
                    target = rng.choice(TARGETS + TARGETS[:2])  # the log a fifth of the time
                    directory = str(tmp_path / ("m%d-%s-%d" % (round_, kind, attempt)))
                    shutil.copytree(bases[base][0], directory)
                    path = os.path.join(directory, target)
                    try:
                        what = getattr(mutator, kind)(path, directory)
                        break
                    except (ValueError, TypeError, IndexError, KeyError, StopIteration):  # not applicable here
                        shutil.rmtree(directory, ignore_errors=True)
                if what is None:
                    continue
                label = "seed %d, %s on %s/%s (%s)" % (SEED, kind, base, target, what)
                s = stats[kind]
                s["tried"] += 1
                for name, request in commands(directory, path):
                    result = server.run(request)
                    runs += 1
                    s["codes"][result["code"]] = s["codes"].get(result["code"], 0) + 1
                    if result["peak"] > s["peak"]:
                        s["peak"], s["worst"] = result["peak"], "%s %s" % (name, what)
                    problem = broken_rules(name, result)
                    got = normalized(result, directory)
                    want = expected[base, target][name]
                    if problem is None and kind in NEUTRAL and got != want:
                        problem = "changed the verdict: %r, unmutated %r" % (got, want)
                    if problem is None and kind in DAMAGE and got[0] not in (2, 3) and got[:2] != want[:2]:
                        problem = "damage read as another answer: %r, unmutated %r" % (got[:2], want[:2])
                    if problem:
                        failures.append("%s: %s %s" % (label, name, problem))
                shutil.rmtree(directory, ignore_errors=True)
    finally:
        server.close()
    elapsed = time.perf_counter() - started
    lines = ["fuzzed with seed %d: %d mutants, %d runs in %.0f s" % (
        SEED, sum(s["tried"] for s in stats.values()), runs, elapsed),
        "%-14s %6s  %-28s %s" % ("kind", "tried", "exit codes (runs)", "worst peak RSS")]
    for kind in KINDS:
        s = stats[kind]
        codes = ", ".join("%d: %d" % kv for kv in sorted(s["codes"].items()))
        lines.append("%-14s %6d  %-28s %.0f MB (%s)" % (kind, s["tried"], codes, s["peak"] / MB, s["worst"][:60]))
    print("\n" + "\n".join(lines))
    assert not failures, "%d failures, e.g.:\n%s" % (len(failures), "\n".join(failures[:12]))
    for kind in KINDS:
        assert stats[kind]["tried"] >= min(MIN_ROUNDS, EXPENSIVE.get(kind, PER_KIND)), (kind, "too few mutants")
