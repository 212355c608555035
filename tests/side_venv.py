"""Side virtual environments the suite builds itself (another Gymnasium version, Ray RLlib), cached between
runs and built once under a file lock, so that two sessions never build the same venv at once; and the
other way round, installed packages hidden from a fresh interpreter (``hiding``)."""

import os
import shutil
import subprocess
import sys

import pytest


def hiding(*packages):
    """Python source to run first in a fresh interpreter: importing any of ``packages`` (or a module in one)
    then fails, as on a machine where they are not installed."""
    return ("import sys\n"
            "class _Hidden:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.partition('.')[0] in " + repr(packages) + ":\n"
            "            raise ImportError('No module named ' + repr(name) + ' (hidden by the test)')\n"
            "sys.meta_path.insert(0, _Hidden())\n")


def python_in(venv):
    return os.path.join(venv, "Scripts", "python.exe") if os.name == "nt" else os.path.join(venv, "bin", "python")


def imported_version(python, imports, module, timeout=60):
    """``module.__version__`` as ``python`` imports it after ``imports``, or None where it cannot."""
    code = "import %s; print(%s.__version__)" % (imports, module)
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[-1] if out.returncode == 0 and lines else None


def _lock(f, take):
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock; two sessions building at once may have to retry
        return
    fcntl.flock(f, fcntl.LOCK_EX if take else fcntl.LOCK_UN)


def _install(python, args, timeout):
    """``pip install`` of ``args`` (a list), or of the first of the alternatives ``args`` (a tuple of lists)
    that installs; raises the last failure's CalledProcessError where none does."""
    failure = None
    for one in (args if isinstance(args, tuple) else (args,)):
        try:
            subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *one],
                           check=True, capture_output=True, text=True, timeout=timeout)
            return
        except subprocess.CalledProcessError as exc:
            failure = exc
    raise failure


def cached_venv(venv, marker, what, installs, version, expected, install_timeout=600):
    """The Python of the venv at ``venv``, built with ``pip install`` of each list in ``installs`` in turn
    unless ``marker`` is there and ``version(python)`` gives ``expected``; an item of ``installs`` that is a
    tuple of lists holds alternatives, tried in order until one installs (the oldest NumPy that has a wheel,
    say). Skips the test, with the reason, where it cannot be built (no package index); fails where it was
    built but imports another version."""
    python, marker = python_in(venv), os.path.join(venv, marker)
    with open(venv + ".lock", "w") as lock:
        _lock(lock, True)
        try:
            if os.path.exists(marker) and version(python) == expected:
                return python
            shutil.rmtree(venv, ignore_errors=True)
            try:
                subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True, text=True,
                               timeout=180)
                for args in installs:
                    _install(python, args, install_timeout)
            except subprocess.CalledProcessError as exc:
                shutil.rmtree(venv, ignore_errors=True)
                tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-1:] or ["no output"]
                pytest.skip("cannot build a venv with %s (no network or package index?): %s" % (what, tail[0]))
            except (OSError, subprocess.TimeoutExpired) as exc:
                shutil.rmtree(venv, ignore_errors=True)
                pytest.skip("cannot build a venv with %s: %s" % (what, exc))
            got = version(python)
            assert got == expected, "the venv at %s does not import %s (got %r)" % (venv, what, got)
            open(marker, "w").close()
            return python
        finally:
            _lock(lock, False)
