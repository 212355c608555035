"""Builds the Cython core. Without a C compiler the package installs anyway and
runs on its pure-Python core (stepledger/_fallback.py).

The core is three C units: the translated _core.pyx, and the digests of several
messages at once for AVX2 (_blake2b_x4.c) and AVX-512 (_blake2b_x8.c). They
compile side by side, one per CPU (compile_side_by_side), without debug info
(-g0, which changes no instruction): on 2 idle cores the compile takes about
18 s rather than 44 s (docs/COST.md, "The first install").
"""

import glob
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithDocs(build_py):
    """Ship docs/*.md inside the package (stepledger/docs/), so that ``stepledger docs`` finds them in a wheel."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "stepledger", "docs")
        pages = sorted(glob.glob(os.path.join(HERE, "docs", "*.md")))
        if pages:
            os.makedirs(target, exist_ok=True)
            for page in pages:
                shutil.copy2(page, target)


def compile_side_by_side(compiler):
    """Make ``compiler`` compile the C units of an extension side by side, one per CPU: setuptools compiles
    them one after the other (its ``--parallel`` builds several extensions at once, not the units of one).
    Each unit is compiled by a ``compile()`` call of its own, the objects returned in the sources' order."""
    serial = compiler.compile
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def compile(sources, *args, **kwargs):
        if len(sources) < 2 or workers < 2:
            return serial(sources, *args, **kwargs)
        # the largest unit (the translated _core.pyx) starts first; the small ones share the other CPUs
        order = sorted(range(len(sources)), key=lambda k: -os.path.getsize(sources[k]))
        with ThreadPoolExecutor(max_workers=min(workers, len(sources))) as pool:
            parts = dict(zip(order, pool.map(lambda k: serial([sources[k]], *args, **kwargs), order)))
        return [obj for k in range(len(sources)) for obj in parts[k]]

    compiler.compile = compile


MISSING: list = []  # why extensions() made no extension (numpy or Cython missing): build_ext says so


class OptionalBuildExt(build_ext):
    """Build the core if possible; warn and fall back to pure Python if not."""

    def run(self):
        if MISSING:  # a build of the core asked for, with nothing to build it with
            self._warn(RuntimeError(MISSING[0]))
        try:
            super().run()
        except Exception as exc:  # no compiler, no Cython, no headers
            self._warn(exc)

    def build_extension(self, ext):
        if self.compiler.compiler_type == "unix":  # MSVC sets itself up on its first compile: one at a time
            compile_side_by_side(self.compiler)
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._warn(exc)

    def _warn(self, exc):
        if os.environ.get("STEPLEDGER_REQUIRE_CORE"):
            raise exc
        sys.stderr.write("warning: the stepledger core was not compiled (%s); "
                         "the pure-Python core will be used\n" % (exc,))


def write_layout():
    """Write stepledger/_layout.pxi: the live token's layout from format/schema.py, as compile-time constants
    of the compiled core (T_<FIELD> where a field starts, W_<FIELD> its width, T_SIZE, F_* the flag bits)."""
    import importlib.util
    path = os.path.join(HERE, "stepledger", "format", "schema.py")
    spec = importlib.util.spec_from_file_location("_stepledger_schema", path)
    schema = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(schema)
    lines = ["# Written by setup.py from stepledger/format/schema.py (TOKEN_FIELDS); do not edit.", "cdef enum:",
             "    T_SIZE = %d" % schema.TOKEN_SIZE]
    for name, _ in schema.TOKEN_FIELDS:
        lines.append("    T_%s = %d" % (name.upper(), schema.TOKEN_OFFSETS[name]))
        lines.append("    W_%s = %d" % (name.upper(), schema.TOKEN_WIDTHS[name]))
    lines += ["    F_TERMINATED = %d" % schema.TOKEN_TERMINATED, "    F_TRUNCATED = %d" % schema.TOKEN_TRUNCATED]
    text = "\n".join(lines) + "\n"
    path = os.path.join(HERE, "stepledger", "_layout.pxi")
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)


def extensions():
    try:
        import numpy
        from Cython.Build import cythonize
    except ImportError as exc:  # pip's build has both (pyproject.toml); `python setup.py build_ext` may not
        MISSING.append("%s: pyproject.toml's build requires numpy and Cython>=3" % (exc,))
        sys.stderr.write("warning: the stepledger core will not be compiled (%s); the pure-Python core will be "
                         "used\n" % MISSING[-1])
        return []
    write_layout()
    ext = Extension(
        "stepledger._core",
        ["stepledger/_core.pyx", "stepledger/_blake2b_x4.c", "stepledger/_blake2b_x8.c"],
        include_dirs=[numpy.get_include(), "stepledger"],
        depends=["stepledger/_blake2b.h", "stepledger/_layout.pxi"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        # -g0 after Python's own -g: debug info was a third of the compile time, and changes no instruction
        extra_compile_args=["-O3", "-g0"] if sys.platform != "win32" else [],
    )
    try:
        return cythonize([ext], compiler_directives={"language_level": "3"}, quiet=True)
    except Exception as exc:  # Cython too old or broken: install the pure-Python core
        if os.environ.get("STEPLEDGER_REQUIRE_CORE"):
            raise
        sys.stderr.write("warning: could not cythonize the stepledger core (%s)\n" % (exc,))
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt, "build_py": BuildPyWithDocs})
