"""Imports inside stepledger run one way: the writer never reaches the reader, the live check never
reaches the offline comparison, and no module takes another's private names.

The graph is read from the source (every import statement, those inside functions too), so an
import added later anywhere in a module counts.
"""

import ast
import pathlib

import stepledger

PACKAGE = pathlib.Path(stepledger.__file__).parent

WRITER = ("stepledger.recording", "stepledger.ledgerfile", "stepledger._zipwriter")
READER = ("stepledger.read", "stepledger.compare", "stepledger.episodes")


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
    assert "stepledger.read" in graph["stepledger.compare"]
    assert "stepledger.wording" in graph["stepledger.live"]
    assert "stepledger.ledgerfile" in _reach(graph, "stepledger.recording")


def test_the_writer_does_not_import_the_reader():
    graph = _graph()
    for writer in WRITER:
        reached = _reach(graph, writer)
        assert not reached & set(READER), (writer, sorted(reached & set(READER)))


def test_the_live_check_does_not_depend_on_the_offline_report():
    reached = _reach(_graph(), "stepledger.live")
    assert "stepledger.compare" not in reached, sorted(reached)
    assert "stepledger.read" not in reached, sorted(reached)


def test_no_module_takes_another_modules_private_names():
    taken = [(m, dep, n) for m, edges in _graph().items() for dep, names in edges.items() for n in names
             if n.startswith("_") and not n.startswith("__") and dep != m]
    assert taken == []
