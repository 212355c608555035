"""Each test's outcome in a library's own suite run by an upstream plugin (tests/upstream_plugin.py for SB3,
tests/tianshou/ts_upstream_plugin.py, tests/torchrl/trl_upstream_plugin.py): passed, failed or skipped, a test
that failed in any phase (setup, call, teardown) counted failed. The plugin hands pytest's reports to ``add`` and
writes ``outcomes.json`` with ``write`` at the end of the session."""

import json
import os


class Outcomes:
    def __init__(self):
        self.by_test = {}

    def add(self, report):
        before = self.by_test.get(report.nodeid)
        if report.failed:
            outcome = "failed"
        elif report.skipped:
            outcome = "skipped" if before is None else before
        else:
            outcome = before or "passed"
        if before != "failed":
            self.by_test[report.nodeid] = outcome

    def write(self, out):
        with open(os.path.join(out, "outcomes.json"), "w") as f:
            json.dump(self.by_test, f, indent=1, sort_keys=True)
