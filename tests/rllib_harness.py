"""One short RLlib PPO run with the ledgers in, as a subprocess of tests/rllib/test_rllib.py (so that each run has a
timeout and a run can be killed).

    python tests/rllib_harness.py SPEC_JSON    (a spec, or a list of them: one Ray session, run in turn)

SPEC keys: path (the ledgers), env ("CartPole-v1" | "Pendulum-v1"), runners, envs (per runner), learners,
iterations, batch (train_batch_size_per_learner), end ("stop": algo.stop() then ray.shutdown(); "shutdown":
ray.shutdown() alone, which kills the runners' actors with no close(); "kill": print "trained N" after each
iteration and train on, until the test SIGKILLs this process), vectorize ("sync" | "async"), flush_interval,
evaluation (evaluation runners, 0: none), recreate (SIGKILL that runner's process after the iterations and train on until RLlib has it back),
fault (a dict for stepledger.rllib.inject) or faults (a list of them), algo ("PPO" or "DQN"), placement, seed,
modules (multi-agent: "shared", every agent feeding one module, or "own", a module each; env then one of
tests/rllib_ma_envs.py's, env_config its config),
live (instrument(..., live=True): the run's "metrics" are the live check's counts in RLlib's results),
batch_mode ("truncate_episodes", RLlib's default, or "complete_episodes"),
timeout (seconds the run may take, RUN_TIMEOUT by default: SIGALRM ends the session past it). It prints one JSON line: a list of what each run did.
"""

import glob
import json
import os
import signal
import sys
import time

import ray
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

import stepledger.rllib
import rllib_ma_envs

RUN_TIMEOUT = 420  # seconds a run may take (a run ended by "kill" has none here: the test SIGKILLs it)


def config_for(spec):
    runners, envs = spec.get("runners", 2), spec.get("envs", 2)
    learners = spec.get("learners", 0)
    batch = spec.get("batch", 200)
    if spec.get("algo") == "DQN":  # a replay buffer between the runners and the learner
        from ray.rllib.algorithms.dqn import DQNConfig
        return (DQNConfig().environment(spec.get("env", "CartPole-v1"))
                .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs, num_cpus_per_env_runner=0.25,
                             rollout_fragment_length=50)
                .training(train_batch_size_per_learner=32, num_steps_sampled_before_learning_starts=100)
                .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[16]))
                .debugging(seed=spec.get("seed", 0), log_level="ERROR"))
    config = (PPOConfig()
              .environment(spec.get("env", "CartPole-v1"))
              .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs,
                           num_cpus_per_env_runner=0.25 if runners else 1,
                           gym_env_vectorize_mode=spec.get("vectorize", "sync"),
                           batch_mode=spec.get("batch_mode", "truncate_episodes"))
              .learners(num_learners=learners, num_cpus_per_learner=0.25 if learners else 1)
              .training(train_batch_size_per_learner=batch, minibatch_size=min(batch, 100), num_epochs=1)
              .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[16]))
              .debugging(seed=spec.get("seed", 0), log_level="ERROR")
              .reporting(metrics_num_episodes_for_smoothing=1))
    if spec.get("modules"):
        config = multi_agent(config, spec)
    if spec.get("evaluation"):
        config = config.evaluation(evaluation_interval=1, evaluation_num_env_runners=spec["evaluation"],
                                   evaluation_duration=2, evaluation_duration_unit="episodes")
    if spec.get("recreate"):
        config = config.fault_tolerance(restart_failed_env_runners=True)
    return config


def multi_agent(config, spec):
    """The multi-agent part of a config: the env's agents feed one shared module, or a module each."""
    env = rllib_ma_envs.ENVS[spec["env"]](spec.get("env_config"))
    agents = list(env.possible_agents)
    config = config.environment(spec["env"], env_config=spec.get("env_config") or {})
    if spec["modules"] == "shared":
        return config.multi_agent(policies={"shared"}, policy_mapping_fn=rllib_ma_envs.shared_module)
    return config.multi_agent(policies={str(a) for a in agents}, policy_mapping_fn=rllib_ma_envs.own_module)


def wait_for_spills(path, envs, timeout=120):
    """Until each env ledger ``env-N.npz`` (N in envs) in the local directory ``path`` has a spill segment: the
    runner's idle spiller writes one an interval after it was due, whether the runner steps or not."""
    deadline = time.monotonic() + timeout
    while not all(glob.glob(os.path.join(path, "env-%d.npz.spill" % i, "seg-*.npz")) for i in envs):
        if time.monotonic() > deadline:
            raise AssertionError("no spill segment of env %s in %s after %d s" % (
                [i for i in envs if not glob.glob(os.path.join(path, "env-%d.npz.spill" % i, "seg-*.npz"))],
                path, timeout))
        time.sleep(0.05)


def run_one(spec):
    out = {"iterations": 0}
    config = config_for(spec)
    config = stepledger.rllib.instrument(config, spec["path"], flush_interval=spec.get("flush_interval"),
                                         placement=spec.get("placement", "auto"), live=spec.get("live", False))
    for fault in spec.get("faults") or ([spec["fault"]] if spec.get("fault") else []):
        config = stepledger.rllib.inject(config, **fault)
    algo = config.build_algo()
    pids = dict(algo.env_runner_group.foreach_env_runner(lambda r: (r.worker_index, os.getpid()),
                                                          local_env_runner=False))
    out["runner_pids"] = pids
    if spec.get("algo") != "DQN":  # the learner placement: each learner's connector pipeline, its pieces in order
        out["learner_pieces"] = [r.get() for r in algo.learner_group.foreach_learner(stepledger.rllib.learner_pieces)]
    for _ in range(spec.get("iterations", 1)):
        result = algo.train()
        out["iterations"] += 1
    if spec.get("end") == "kill":
        while True:  # mid-training when the test's SIGKILL comes
            print("trained %d" % out["iterations"], flush=True)
            algo.train()
            out["iterations"] += 1
    if spec.get("recreate"):
        # SIGKILL to one runner's process, once each of its envs has spilled: RLlib's fault tolerance has Ray
        # restart its actor; train on until the restarted runner has sampled in two iterations
        n = spec.get("envs", 2)
        wait_for_spills(spec["path"], range((spec["recreate"] - 1) * n, spec["recreate"] * n))
        os.kill(pids[spec["recreate"]], signal.SIGKILL)
        deadline, back = time.monotonic() + 180, 0
        while back < 2 and time.monotonic() < deadline:
            result = algo.train()
            out["iterations"] += 1
            healthy = algo.env_runner_group.num_healthy_remote_workers()
            back = back + 1 if healthy == spec.get("runners", 2) else 0
        out["runner_pids_after"] = dict(algo.env_runner_group.foreach_env_runner(
            lambda r: (r.worker_index, os.getpid()), local_env_runner=False))
    out["env_steps"] = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
    if spec.get("live"):  # the live check's counts, as RLlib's metrics have them after the last iteration
        from stepledger.recording.live import METRIC_CHECKED, METRIC_FAULTS
        out["metrics"] = {name: result["env_runners"].get(name) for name in (METRIC_FAULTS, METRIC_CHECKED)}
    if spec.get("end", "stop") == "stop":
        algo.stop()
    else:
        wait_for_spills(spec["path"], range(spec.get("runners", 2) * spec.get("envs", 2)))
        ray.shutdown()  # no algo.stop(): the runners' actors are killed
    return out


def main():
    specs = json.loads(sys.argv[1])
    specs = [specs] if isinstance(specs, dict) else specs
    assert all(s.get("end", "stop") == "stop" for s in specs[:-1]), "only the last run may end by shutdown or kill"
    # a cluster of its own (address='local'), never one that another process left running on this machine
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rllib_ma_envs.register()
    outs = []

    def overran(signum, frame):
        raise TimeoutError("run %d of %d (%s) took over its %d s" % (len(outs) + 1, len(specs), spec["path"], limit))
    signal.signal(signal.SIGALRM, overran)
    try:
        for spec in specs:
            limit = int(spec.get("timeout", 0 if spec.get("end") == "kill" else RUN_TIMEOUT))
            signal.alarm(limit)  # a timeout on each run, not only on the session (the caller's)
            outs.append(run_one(spec))
            signal.alarm(0)
    finally:
        signal.alarm(0)
        ray.shutdown()
    print(json.dumps(outs), flush=True)


if __name__ == "__main__":
    main()
