"""Imports inside stepledger run one way: down the layers (LAYERS, the folders), the writer never
reaches the reader, the live check never reaches the offline comparison, a library's folder reaches
no other library but those it builds on, and no module takes another's private names.

The graph is read from the source (every import statement, those inside functions too), so an
import added later anywhere in a module counts.
"""

import ast
import pathlib

import stepledger
from stepledger.libraries import LIBRARIES

PACKAGE = pathlib.Path(stepledger.__file__).parent

WRITER = ("stepledger.recording", "stepledger.format.ledgerfile", "stepledger.format.zipwriter")
READER = ("stepledger.report.read", "stepledger.report.compare", "stepledger.report.episodes")

LIBRARY_FOLDERS = LIBRARIES  # the table of libraries: each is a folder

# The layers, bottom up: a module imports only from its own layer and those below it. A name ending in
# "." is a folder (every module in it).
LAYERS = (
    ("facts", ("stepledger.__about__", "stepledger.errors", "stepledger.format.schema")),
    ("core", ("stepledger._core", "stepledger._fallback", "stepledger.core")),
    ("format", ("stepledger.format.",)),
    ("wording", ("stepledger.known_wrappers", "stepledger.wording")),
    ("recording", ("stepledger.recording.",)),
    ("report", ("stepledger.report.",)),
    ("faults", ("stepledger.faults.",)),
    ("libraries", ("stepledger.libraries",) + tuple("stepledger.%s." % name for name in LIBRARY_FOLDERS)),
    ("command line", ("stepledger.cli.",)),
    ("the package's face", ("stepledger", "stepledger.__main__")),
)
# Old import paths (stepledger._moved) name modules by strings, resolved on first use: no arrow.
OUTSIDE_THE_LAYERS = ("stepledger._moved",)
# A library's folder imports Gymnasium's (every library's envs are Gymnasium envs) and those it builds on.
# rllib: its agents' streams; tianshou: PettingZooEnv around LedgerAECEnv
BUILDS_ON = {"pettingzoo": {"sb3"}, "rllib": {"pettingzoo"}, "tianshou": {"pettingzoo"}}


def layer_of(module):
    for k, (_, members) in enumerate(LAYERS):
        for m in members:
            if module == m or (m.endswith(".") and (module + ".").startswith(m)):
                return k
    return None


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph():
    """{module: {imported module: [names taken from it]}} for every module of the package."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    compiled = {_module_name(p) for p in PACKAGE.rglob("*.pyx")}  # the compiled core imports _schema only
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("stepledger"):
                        edges.setdefault(alias.name, [])
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                elif node.module and node.module.startswith("stepledger"):
                    target = node.module
                else:
                    continue
                for alias in node.names:
                    sub = target + "." + alias.name
                    if sub in modules or sub in compiled:  # from . import wording: the module itself
                        edges.setdefault(sub, [])
                    else:
                        edges.setdefault(target, []).append(alias.name)
    return graph


def _reach(graph, start):
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        for dep in graph.get(m, ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_the_graph_is_read():
    graph = _graph()
    assert "stepledger.report.read" in graph["stepledger.report.compare"]
    assert "stepledger.wording" in graph["stepledger.recording.live"]
    assert "stepledger.format.ledgerfile" in _reach(graph, "stepledger.recording")


def test_every_module_has_a_layer():
    graph = _graph()
    assert [m for m in graph if layer_of(m) is None and m not in OUTSIDE_THE_LAYERS] == []


def test_no_arrow_points_back_up():
    up = [(m, dep, LAYERS[layer_of(m)][0], LAYERS[layer_of(dep)][0]) for m, edges in _graph().items()
          if m not in OUTSIDE_THE_LAYERS for dep in edges
          if dep not in OUTSIDE_THE_LAYERS and layer_of(dep) is not None and layer_of(dep) > layer_of(m)]
    assert up == []


def test_a_library_reaches_only_the_libraries_it_builds_on():
    crossing = []
    for m, edges in _graph().items():
        parts = m.split(".")
        if len(parts) < 2 or parts[1] not in LIBRARY_FOLDERS:
            continue
        for dep in edges:
            other = dep.split(".")[1] if dep.count(".") else None
            if other in LIBRARY_FOLDERS and other not in (parts[1], "gymnasium") and other not in BUILDS_ON.get(parts[1], ()):
                crossing.append((m, dep))
    assert crossing == []


def test_the_old_import_paths_resolve_to_the_modules_that_hold_them():
    import importlib

    from stepledger import _moved
    for old, new in _moved.MODULES.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
    for module, names in _moved.NAMES.items():
        for name, where in names.items():
            try:
                value = getattr(importlib.import_module(module), name)
            except ImportError:  # the library it adapts is not installed here
                continue
            assert value is getattr(importlib.import_module(where), name), (module, name)


def test_the_writer_does_not_import_the_reader():
    graph = _graph()
    for writer in WRITER:
        reached = _reach(graph, writer)
        assert not reached & set(READER), (writer, sorted(reached & set(READER)))


def test_the_live_check_does_not_depend_on_the_offline_report():
    reached = _reach(_graph(), "stepledger.recording.live")
    assert "stepledger.report.compare" not in reached, sorted(reached)
    assert "stepledger.report.read" not in reached, sorted(reached)


def test_no_module_takes_another_modules_private_names():
    taken = [(m, dep, n) for m, edges in _graph().items() for dep, names in edges.items() for n in names
             if n.startswith("_") and not n.startswith("__") and dep != m]
    assert taken == []


def test_a_librarys_public_names_stay_themselves_whichever_of_its_modules_is_imported_first():
    """stepledger.rllib.instrument is a function in instrument.py: ``import stepledger.rllib.faults`` (which imports
    instrument.py) before it is looked up once had the package's attribute be the module, and
    ``stepledger.rllib.instrument(config, path)`` raise "'module' object is not callable". Each library's every
    module imported first, in a fresh interpreter, then each public name looked up."""
    import subprocess
    import sys
    script = r'''
import importlib, os, sys
face = importlib.import_module(sys.argv[1])
names = getattr(face, "_NAMES", {})
folder = os.path.dirname(face.__file__)
for f in sorted(os.listdir(folder)):
    if f.endswith(".py") and f != "__init__.py":
        try:
            importlib.import_module(sys.argv[1] + "." + f[:-3])
        except ImportError:
            pass  # the library it adapts is not installed here
bad = []
for name, sub in names.items():
    try:
        want = getattr(importlib.import_module(sys.argv[1] + "." + sub), name)
    except ImportError:
        continue
    if getattr(face, name) is not want:
        bad.append("%s.%s is %r" % (sys.argv[1], name, getattr(face, name)))
print("\n".join(bad))
'''
    for library in LIBRARY_FOLDERS:
        face = "stepledger." + library
        proc = subprocess.run([sys.executable, "-c", script, face], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and not proc.stdout.strip(), (face, proc.stdout, proc.stderr[-2000:])
