"""Runs reading commands on ledger files, each in its own forked process, for the fuzzer.

Started by tests/format/test_fuzz_ledgers.py as ``python fuzz_server.py``. It imports
stepledger once, then reads one JSON request a line on stdin and answers one
JSON line on stdout per request, in order:

    {"argv": ["compare", ENV_DIR, TRAINER]}   the command line's main(argv)
    {"read": PATH}                            stepledger.read(PATH), every column and kept value read through
    (both take "timeout" in seconds)

    -> {"code": exit code, "out": stdout, "err": stderr, "peak": peak RSS in bytes,
        "timeout": true if it was killed for taking too long, "seconds": wall time}

Each request runs in a child forked from this small process, so its peak RSS
(ru_maxrss from wait4) is that of one command alone, and a hang or a runaway
allocation is bounded: the child gets an address-space limit (RLIMIT_AS) as a
backstop and is killed at its timeout. A child that raises anything but
SystemExit prints the traceback and exits 1, as the interpreter would.
"""

import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback

import numpy as np

import stepledger  # noqa: F401  (imported once, before any fork)
from stepledger.format import schema as S
from stepledger.cli.main import main as cli_main
from stepledger.errors import LedgerError

ADDRESS_SPACE_BACKSTOP = 1 << 30  # above this process's own address space


def _vm(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def read_everything(path):
    """What the API gives for ``path``, read through in chunks: a digest of it, printed."""
    import hashlib

    from stepledger import read
    h = hashlib.blake2b(digest_size=16)
    with read(path) as led:
        h.update(json.dumps(led.meta, sort_keys=True).encode())
        for idx, stream in led.streams.items():
            h.update(b"stream %d %d;" % (idx, len(stream)))
            for chunk in stream.chunks(names=S.EVENT_COLUMN_NAMES, size=1 << 16):
                for name in S.EVENT_COLUMN_NAMES:
                    h.update(np.ascontiguousarray(chunk[name]).tobytes())
            for p in stream.pieces:
                for name in sorted(p.lf.members):
                    if name.startswith("values_") or name in ("episode", "step"):
                        src = p.lf.source(name)
                        for a in range(p.start, p.stop, 1 << 16):
                            h.update(np.ascontiguousarray(src.read(a, min(a + (1 << 16), p.stop))).tobytes())
            if led.meta.get("keep_values") and len(stream):
                for field in ("obs", "act"):
                    rows = stream.value_rows(field, len(stream) - 1)
                    h.update(repr([np.asarray(r).tolist() for r in rows or []]).encode())
    print(h.hexdigest())


def _child(request, out_path, err_path):
    out = os.open(out_path, os.O_WRONLY)
    err = os.open(err_path, os.O_WRONLY)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdout = os.fdopen(1, "w")
    sys.stderr = os.fdopen(2, "w")
    sys.stdin = open(os.devnull)
    limit = _vm("VmSize") + ADDRESS_SPACE_BACKSTOP
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    code = 0
    try:
        if "argv" in request:
            code = cli_main(request["argv"])
        else:
            try:
                read_everything(request["read"])
            except LedgerError as exc:
                print("read: %s" % exc, file=sys.stderr)
                code = 2
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code or 0)


def run(request):
    timeout = float(request.get("timeout", 20))
    with tempfile.NamedTemporaryFile(delete=False) as o, tempfile.NamedTemporaryFile(delete=False) as e:
        out_path, err_path = o.name, e.name
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        _child(request, out_path, err_path)
    killed = False
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            killed = True
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.002)
    seconds = time.perf_counter() - t0
    with open(out_path, errors="replace") as f:
        out = f.read()
    with open(err_path, errors="replace") as f:
        err = f.read()
    os.unlink(out_path)
    os.unlink(err_path)
    code = os.waitstatus_to_exitcode(status)
    return {"code": code, "out": out[:20000], "err": err[:20000], "peak": usage.ru_maxrss * 1024,
            "timeout": killed, "seconds": seconds}


def serve():
    for line in sys.stdin:
        if not line.strip():
            continue
        result = run(json.loads(line))
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
