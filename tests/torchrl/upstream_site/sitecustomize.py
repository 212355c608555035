"""Imported at the start of every Python process of test_torchrl_upstream.py's inner pytest (this directory is on
its PYTHONPATH): TorchRL's workers started by spawn (ParallelEnv, the multi-process collectors) are fresh
interpreters that never see the pytest plugin, so the env-side patches of trl_upstream_plugin are installed here
too, in every mode but ``bare``."""

import os

if os.environ.get("STEPLEDGER_UPSTREAM_MODE", "bare") != "bare":
    import trl_upstream_plugin

    trl_upstream_plugin._install_env_side()
