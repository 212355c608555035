"""What stepledger.rllib costs a multi-agent RLlib run's sampling: both ledgers against none, in one Ray session.

Two PPO algorithms of one multi-agent config are built at once, one plain and one through
``stepledger.rllib.instrument``: a ``MultiAgentEnv`` of 4 agents acting together (Box(3) observations,
Discrete(2) actions, one shared module), ``--runners`` remote env runners of ``--envs`` sub-envs each. They take
turns (each first every other round): ``sample(num_timesteps=--block)`` on every runner of one, then of the
other; the instrumented turn also hands the sampled episodes to its learner's recorder (the trainer side, as
its learner connector would be handed them), so that a turn pays for both ledgers. Printed: the median
throughput (env steps a second) of each, the median of the rounds' paired ratios (target at most 1.05x), and
the median paired ratio of the runner processes' CPU time an env step, which the machine's load moves less.

    python benchmarks/rllib_multiagent_overhead.py            # 12 rounds
    python benchmarks/rllib_multiagent_overhead.py --quick    # a smoke run

Needs Ray RLlib and PettingZoo (run it in the RLlib tests' venv, tests/rllib/test_rllib_venv.py).
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

TARGET_RATIO = 1.05


def make_env_class():
    import gymnasium as gym
    import numpy as np
    from ray.rllib.env.multi_agent_env import MultiAgentEnv

    class FourAgents(MultiAgentEnv):
        """4 agents acting together; an episode ends after 20 to 40 steps."""

        def __init__(self, config=None):
            super().__init__()
            self.possible_agents = ["agent_%d" % k for k in range(4)]
            self.agents = list(self.possible_agents)
            space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
            self.observation_spaces = {a: space for a in self.agents}
            self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.agents}
            self.rng = np.random.default_rng(0)

        def reset(self, *, seed=None, options=None):
            self.t, self.end = 0, int(self.rng.integers(20, 41))
            return {a: self.rng.uniform(-1, 1, 3).astype(np.float32) for a in self.agents}, {}

        def step(self, actions):
            self.t += 1
            obs = {a: self.rng.uniform(-1, 1, 3).astype(np.float32) for a in actions}
            rewards = {a: float(actions[a]) for a in actions}
            over = self.t >= self.end
            return obs, rewards, {"__all__": over}, {"__all__": False}, {}

    return FourAgents


def config(runners, envs, block):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    return (PPOConfig().environment("four-agents")
            .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs, num_cpus_per_env_runner=0.25)
            .learners(num_learners=0, num_cpus_per_learner=0.25)
            .multi_agent(policies={"shared"}, policy_mapping_fn=lambda agent_id, episode, **kw: "shared")
            .training(train_batch_size_per_learner=block, minibatch_size=block, num_epochs=1)
            .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[16]))
            .debugging(seed=0, log_level="ERROR"))


def runner_pids(algo):
    return [pid for _, pid in algo.env_runner_group.foreach_env_runner(
        lambda r: (r.worker_index, os.getpid()), local_env_runner=False)]


def cpu_of(pids):
    import psutil
    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def turn(algo, block, record=None):
    """One turn: every runner samples ``block`` env steps; (seconds, env steps, runner CPU seconds)."""
    pids = algo._bench_pids
    cpu0, t0 = cpu_of(pids), time.perf_counter()
    parts = algo.env_runner_group.foreach_env_runner(lambda r: r.sample(num_timesteps=block), local_env_runner=False)
    episodes = [ep for part in parts for ep in part]
    if record is not None:
        record(episodes)
    seconds, cpu = time.perf_counter() - t0, cpu_of(pids) - cpu0
    return seconds, sum(len(ep) for ep in episodes), cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--block", type=int, default=400, help="env steps each runner samples a turn")
    ap.add_argument("--runners", type=int, default=2)
    ap.add_argument("--envs", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.block = 2, 100
    import ray
    from ray.tune.registry import register_env
    import stepledger.rllib
    FourAgents = make_env_class()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    register_env("four-agents", lambda ctx: FourAgents(ctx))
    out = tempfile.mkdtemp(prefix="stepledger-rllib-ma-bench-")
    try:
        plain = config(args.runners, args.envs, args.block).build_algo()
        led = stepledger.rllib.instrument(config(args.runners, args.envs, args.block), out).build_algo()
        for algo in (plain, led):
            algo._bench_pids = runner_pids(algo)
        tap = led.learner_group._learner._stepledger_tap
        positions = led._stepledger_positions

        def record(episodes):  # the learner's recorder, as its connector is handed them
            tap.recorder.record(episodes, positions.of(episodes))

        for algo, rec in ((plain, None), (led, record)):  # warm-up: modules built, first resets done
            turn(algo, args.block, rec)
        rows = []
        for k in range(args.rounds):
            order = [(plain, None), (led, record)] if k % 2 == 0 else [(led, record), (plain, None)]
            got = {}
            for algo, rec in order:
                got[algo is led] = turn(algo, args.block, rec)
            rows.append((got[False], got[True]))
            (s0, n0, c0), (s1, n1, c1) = got[False], got[True]
            print("round %2d: plain %7.0f steps/s, ledgers %7.0f steps/s, ratio %.3fx, runner CPU an env step "
                  "ratio %.3fx" % (k, n0 / s0, n1 / s1, (s1 / n1) / (s0 / n0), (c1 / n1) / (c0 / n0)), flush=True)
        plain_tp = statistics.median(n / s for (s, n, _), _ in rows)
        led_tp = statistics.median(n / s for _, (s, n, _) in rows)
        ratio = statistics.median((s1 / n1) / (s0 / n0) for (s0, n0, _), (s1, n1, _) in rows)
        cpu_ratio = statistics.median((c1 / n1) / (c0 / n0) for (_, n0, c0), (_, n1, c1) in rows)
        load = os.getloadavg()
        print("4 agents, %d env runners x %d envs, %d rounds of %d env steps a runner (load average %.1f):"
              % (args.runners, args.envs, args.rounds, args.block, load[0]))
        print("  env steps/s: plain %.0f, both ledgers %.0f; median paired ratio %.3fx (target <= %.2fx); "
              "runner CPU time an env step, median paired ratio %.3fx" % (plain_tp, led_tp, ratio, TARGET_RATIO,
                                                                           cpu_ratio))
        plain.stop()
        led.stop()
    finally:
        ray.shutdown()
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
