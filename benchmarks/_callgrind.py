"""Instruction counts under callgrind, for the benchmarks that give them beside wall time.

A benchmark that counts runs itself again under valgrind with its own ``--count`` arguments; there it calls
``collected(step, items)``, which warms the step up, then runs it once per item inside
``functools.reduce``, the one call callgrind collects. ``per_call`` gives the instructions one call
took. Counts are repeatable whatever else the machine is doing (the same binary, inputs and environment),
where wall time on a shared 2-core machine is not.
"""

import functools
import os
import shutil
import subprocess
import sys
import tempfile

# the same path each time: the core's AVX2 digests (not AVX-512, which not every machine has), a fixed hash seed
ENV = {"STEPLEDGER_NO_AVX512": "1", "PYTHONHASHSEED": "0"}


def available():
    return shutil.which("valgrind") is not None


def collected(step, items):
    """Call ``step(item)`` for each item twice: a warm-up (the interpreter specializes, buffers grow), then
    inside ``functools.reduce``, the one call the counting run collects."""
    for item in items:
        step(item)
    functools.reduce(lambda _, item: step(item), items, None)


def per_call(script, args, calls, timeout=1800, env=None):
    """Instructions per call of ``collected`` in ``script --count *args`` run under callgrind (``calls``: its
    items), or None without valgrind. ``env``: more environment variables for that run (another checkout's
    PYTHONPATH, say)."""
    if not available():
        return None
    with tempfile.TemporaryDirectory(prefix="stepledger-callgrind-") as tmp:
        out = os.path.join(tmp, "callgrind.out")
        subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=functools_reduce",
                        "--callgrind-out-file=" + out, sys.executable, os.path.abspath(script), "--count",
                        *[str(a) for a in args]],
                       env=dict(os.environ, **ENV, **(env or {})), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=timeout)
        with open(out) as f:
            total = next(int(line.split()[1]) for line in f if line.startswith(("summary:", "totals:")))
    return total / calls
