"""Reports as JUnit XML, which CI systems show as test results.

One test suite. For ``stepledger compare`` and ``stepledger episodes``, one
test case per env: it passes when the env agrees and fails with the report's
line for it otherwise, and a skipped one for each file named like an env
ledger that could not be read (exit 3). For ``stepledger check``, one test
case per fault. The report's other lines (the count line, notes and hints)
are the suite's ``system-out``. When the command cannot run (exit 2), one
failing test case, named as the command, that carries the error.
"""

import os
import xml.etree.ElementTree as ET
from typing import Any

from stepledger.format.ledgerfile import atomic_file


def junit_tree(name, cases, other_lines=()):
    """An ElementTree ``<testsuites>``; ``cases`` is a list of (case name, failure line or None[, skip reason])."""
    cases = [tuple(c) + (None,) * (3 - len(c)) for c in cases]
    n_fail = sum(1 for _, failure, _ in cases if failure is not None)
    n_skip = sum(1 for _, failure, skip in cases if failure is None and skip is not None)
    suites = ET.Element("testsuites", name=name, tests=str(len(cases)), failures=str(n_fail), errors="0")
    suite = ET.SubElement(suites, "testsuite", name=name, tests=str(len(cases)), failures=str(n_fail),
                          errors="0", skipped=str(n_skip))
    for case_name, failure, skip in cases:
        case = ET.SubElement(suite, "testcase", classname=name.replace(" ", "."), name=case_name)
        if failure is not None:
            ET.SubElement(case, "failure", message=failure).text = failure
        elif skip is not None:
            ET.SubElement(case, "skipped", message=skip)
    if other_lines:
        ET.SubElement(suite, "system-out").text = "\n".join(other_lines)
    return ET.ElementTree(suites)


def _by_env(report):
    """Cases of a compare Report or an EpisodeReport: one per env, failing with its lines."""
    lines: dict[int, list[str]] = {}
    for d in report.differences:
        if getattr(d, "env", None) is not None:
            lines.setdefault(d.env, []).append(d.line())
    cases: list[tuple[Any, ...]] = [("env %d" % env, "\n".join(lines[env]) if env in lines else None) for env in report.envs]
    own = {line for v in lines.values() for line in v}
    for name, _ in getattr(report, "unread", ()):  # not compared: skipped, with the report's line on it
        line = next(n for n in report.notes if n.startswith(name + ": "))
        cases.append((name, None, line))
        own.add(line)
    return cases, [line for line in report.lines() if line not in own]


def _by_fault(report):
    """Cases of a CheckReport: the clean run, then one per fault."""
    cases: list[tuple[object, ...]] = [
        ("clean run", None if report.clean else "the clean run differs:\n%s" % report.clean)]
    for r in report.results:
        if r.located:
            cases.append((r.fault, None))
        elif not r.exercised and not r.short:  # the env never gives this fault a chance
            cases.append((r.fault, None, r.reason))
        else:
            cases.append((r.fault, " ".join(r.line().split())))
    lines = str(report).splitlines()
    return cases, lines[-2:] if report.directory else lines[-1:]


def write_junit(path, report, name):
    """Write ``report`` (compare, episodes or check) as JUnit XML to ``path``, atomically."""
    cases, other = _by_fault(report) if hasattr(report, "results") else _by_env(report)
    _write(path, junit_tree(name, cases, other))


def write_junit_error(path, name, message):
    """Write the JUnit XML of a command that could not run (exit 2): one failing test case, named ``name``
    (``stepledger compare``), whose failure is ``message``, the line the command printed on stderr."""
    _write(path, junit_tree(name, [(name, message)]))


def _write(path, tree):
    ET.indent(tree)
    with atomic_file(os.fspath(path)) as f:
        tree.write(f, encoding="utf-8", xml_declaration=True)
