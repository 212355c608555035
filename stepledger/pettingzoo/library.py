"""PettingZoo's entry in the table of libraries (``stepledger.libraries``)."""

from stepledger.libraries import Library

LIBRARY = Library(
    name="pettingzoo",
    summary="PettingZoo and SuperSuit: LedgerParallelEnv around the parallel env, SuperSuit's vector envs",
    extra="pettingzoo",
    requires=("pettingzoo", "supersuit"),
    trainer="supersuit",
    trainer_help="a PettingZoo parallel env through SuperSuit's vector env of --form, --num-envs copies, random "
                 "actions, each fault on one agent; a turn-based env (--api aec, or a module with no parallel_env(), "
                 "such as pettingzoo.classic.tictactoe_v3) through the agent_iter loop, --steps games",
    check="stepledger.pettingzoo.check:check_from_cli",
    options=(
        ("--form", dict(choices=("gymnasium", "sb3"), default="gymnasium",
                        help="with --trainer supersuit: concat_vec_envs_v1's base_class, gymnasium "
                             "(LedgerSuperSuitVecEnv) or stable_baselines3 (stepledger.sb3.LedgerVecEnv)")),
        ("--num-cpus", dict(type=int, default=0,
                            help="with --trainer supersuit: SuperSuit's num_cpus (worker processes; 0: in-process)")),
        ("--agent", dict(help="with --trainer supersuit: the agent each fault is injected on (default: the last of "
                              "possible_agents); with --trainer rllib: ENV_ID is a registered multi-agent env whose "
                              "agents all feed one module, and each fault hits this agent (--place connector)")),
        ("--api", dict(choices=("parallel", "aec"), default=None,
                       help="with --trainer supersuit: the PettingZoo API checked, parallel (SuperSuit's vector "
                            "envs) or aec (turn-based: LedgerAECEnv, the agent_iter loop and TurnLedger); default: "
                            "parallel where the module has parallel_env(), else aec")),
    ),
)
