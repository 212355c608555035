"""Ray RLlib's entry in the table of libraries (``stepledger.libraries``)."""

from stepledger.libraries import Library, positive_int

# --agent (the pettingzoo library's option, shared by the check's parser) names, with --trainer rllib, the
# agent each fault hits in a registered multi-agent env (check_rllib(agent=...), --place connector)
LIBRARY = Library(
    name="rllib",
    summary="Ray RLlib: instrument(config, path) puts both ledgers into the env runners and learners",
    extra="rllib",
    requires=("ray.rllib",),
    trainer="rllib",
    trainer_help="short Ray RLlib PPO runs on --runners env runners of --num-envs envs each",
    check="stepledger.rllib.check:check_from_cli",
    options=(
        ("--runners", dict(type=positive_int, default=2, help="with --trainer rllib: remote env runners")),
        ("--iterations", dict(type=positive_int, default=1, help="with --trainer rllib: training iterations "
                                                                 "per run")),
        ("--place", dict(choices=("wrapper", "connector"), default="wrapper",
                         help="with --trainer rllib: inject each fault by a gym wrapper outside LedgerEnv, or by an "
                              "env-to-module connector")),
    ),
)
