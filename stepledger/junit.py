"""A comparison report as JUnit XML, which CI systems show as test results.

One test suite, one test case per env: a case passes when the env's two
streams agree and fails with the report's line for it otherwise.
"""

import os
import xml.etree.ElementTree as ET

from .ledgerfile import atomic_file


def junit_tree(report, name="stepledger compare"):
    """An ElementTree ``<testsuites>`` for a compare Report."""
    by_env = report.by_env()
    suites = ET.Element("testsuites", name=name, tests=str(len(report.envs)),
                        failures=str(len(report.differences)), errors="0")
    suite = ET.SubElement(suites, "testsuite", name=name, tests=str(len(report.envs)),
                          failures=str(len(report.differences)), errors="0", skipped="0")
    for env in report.envs:
        case = ET.SubElement(suite, "testcase", classname="stepledger.compare", name="env %d" % env)
        d = by_env.get(env)
        if d is not None:
            line = d.line()
            failure = ET.SubElement(case, "failure", message=line, type=d.what)
            failure.text = line
    own = {d.line() for d in report.differences}
    lines = [line for line in report.lines() if line not in own]
    if lines:
        ET.SubElement(suite, "system-out").text = "\n".join(lines)
    return ET.ElementTree(suites)


def write_junit(path, report, name="stepledger compare"):
    """Write ``report`` as JUnit XML to ``path`` (atomically: a reader never sees half a file)."""
    tree = junit_tree(report, name)
    ET.indent(tree)
    with atomic_file(os.fspath(path)) as f:
        tree.write(f, encoding="utf-8", xml_declaration=True)
