"""Where the suite and the repository are, for the test files in tests/<group>/ and the helper modules
beside this file (ending_harness.py, side_venv.py, ...), which the test files and their subprocesses import."""

import os

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS_DIR)
