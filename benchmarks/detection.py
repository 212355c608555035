"""Detection under training: SB3 PPO with each boundary fault, caught and located by the step ledger?

The PPO version of tests/faults/test_detection_matrix.py, and of the step-ledger
column of the paper's Fig. 6 (E55: all 189 boundary-fault runs on Pendulum,
21 faults x 3 doses x seeds 0-2, caught and located). For each fault in
stepledger.faults.FAULTS, each dose (one value, 1% of values, every value)
and each seed, SB3's PPO trains on Pendulum-v1 through a SubprocVecEnv:

- in each worker, LedgerEnv outermost around the env, and for env-side
  faults (every fault but the swaps) stepledger.faults.FaultyEnv outside it;
- on the trainer side, stepledger.sb3.LedgerVecEnv innermost around the
  SubprocVecEnv, and for the swaps (values exchanged between envs, which only
  the trainer side can do) FaultyVecEnv between the two.

Then stepledger.compare. A run counts as caught and located when, for every
env the injector changed, compare's first difference for that env is located
(stepledger.check.is_located: the episode and step where the injector first
changed a value there, naming exactly the fields the fault changed),
and no env the injector left alone differs. A run whose fault found no
opportunity (a fractional dose that drew no cell where the fault changes
anything) is shown as such, not counted. Three fault-free runs per env (one
per seed) must compare clean.

Pendulum never terminates, so terminated:drop and terminated:as-trunc (not in
the paper's Fig. 6; stepledger adds them) train on CartPole-v1 instead, with
CartPole's own 500-step limit and the same PPO settings without gSDE (which
SB3 offers for Box actions only); the table says so, and their runs are
counted apart from the paper's 189.

Pendulum runs with a 50-step time limit (gym.make("Pendulum-v1",
max_episode_steps=50)), not its usual 200, so that faults that act only at an
episode end (final observations, truncations) meet opportunities in a short
run. The dose "one" hits env --target (default: the last) at its first
opportunity at or after its step --at (default: half way through the run, so
after the first PPO update when there are two rollouts or more). The 1% dose
draws each cell from a generator seeded with --fault-seed, so the same cells
are hit at every training seed, as stepledger.faults.Dose does.

PPO: rl-baselines3-zoo's tuned Pendulum-v1 settings (n_steps 1024, gae_lambda
0.95, gamma 0.9, n_epochs 10, ent_coef 0.0, learning_rate 1e-3, clip_range
0.2, use_sde, sde_sample_freq 4), with n_steps from --n-steps; torch on one
thread. PPO collects whole rollouts, so a run's timesteps are rounded up to
a multiple of n_steps x n_envs.

    python benchmarks/detection.py          # the default: 4,096 timesteps, 8 envs, n_steps 256;
                                            # 213 runs, under 30 minutes on a busy 2-core machine;
                                            # writes RESULTS.md
    python benchmarks/detection.py --timesteps 102400 --n-envs 16 --n-steps 1024
                                            # the paper's size (rl-zoo's budget, 16 envs)
    python benchmarks/detection.py --faults obs:f16 reward:swap --doses one --seeds 0 --no-write
    python benchmarks/detection.py --quick  # a smoke run (2 faults, dose one, seed 0), writes nothing
"""

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
import warnings

import gymnasium as gym
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import SubprocVecEnv

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import machine, show  # noqa: E402

from stepledger import LedgerEnv, compare  # noqa: E402
from stepledger.check import is_located  # noqa: E402
from stepledger.faults import FAULTS, FaultyEnv, FaultyVecEnv, read_record  # noqa: E402
from stepledger.sb3 import LedgerVecEnv  # noqa: E402

# rl-baselines3-zoo, hyperparams/ppo.yml, "Pendulum-v1" (tuned); n_steps is set from --n-steps.
PENDULUM = dict(n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0, learning_rate=1e-3,
                clip_range=0.2, use_sde=True, sde_sample_freq=4)
NO_SDE = {k: v for k, v in PENDULUM.items() if k not in ("use_sde", "sde_sample_freq")}
# Faults that need an env that terminates; Pendulum never does.
TERMINATING = ("terminated:drop", "terminated:as-trunc")
DOSES = ("one", "0.01", "all")
DOSE_NAMES = {"one": "one value", "0.01": "1% of values", "all": "every value"}
PAPER_FAULTS = tuple(f for f in FAULTS if f not in TERMINATING)  # the 21 rows of the paper's Fig. 6
QUICK_FAULTS = ("obs:f16", "reward:swap")  # one env-side, one trainer-side injector


def env_for(fault):
    """The env a fault's runs train on: Pendulum-v1, or CartPole-v1 for faults that need terminations."""
    return "CartPole-v1" if fault in TERMINATING else "Pendulum-v1"


def settings(env_id, args):
    """(max_episode_steps, PPO settings) for an env."""
    if env_id == "CartPole-v1":
        return None, NO_SDE  # CartPole's own 500-step limit; gSDE is for Box actions only
    return args.max_episode_steps, PENDULUM


def make_env(index, env_id, limit, directory, fault, dose, at, target, fault_seed):
    env = gym.make(env_id, max_episode_steps=limit)
    env = LedgerEnv(env, directory, index=index)  # outermost of the env side, in the worker
    if fault is not None:  # the boundary: outside the env-side ledger
        env = FaultyEnv(env, fault, index=index, dose=dose, at=at, target=target, seed=fault_seed,
                        record=os.path.join(directory, "fault-%d.json" % index))
    return env


def run(env_id, fault, dose, seed, args, directory):
    """One PPO run with both ledgers (fault None: fault-free); returns {env: first change}, compare's report
    and timings."""
    limit, hyper = settings(env_id, args)
    trainer_side = fault is not None and fault.endswith(":swap")
    env_fault = None if trainer_side else fault
    fns = [functools.partial(make_env, i, env_id, limit, directory, env_fault, dose, args.at, args.target,
                             args.fault_seed) for i in range(args.n_envs)]
    venv = SubprocVecEnv(fns, start_method=args.start_method)
    injector = None
    if trainer_side:
        venv = injector = FaultyVecEnv(venv, fault, dose=dose, at=args.at, target=args.target, seed=args.fault_seed)
    trainer_file = os.path.join(directory, "trainer.npz")
    venv = LedgerVecEnv(venv, trainer_file)  # innermost of the trainer side
    hyper = dict(hyper, n_steps=args.n_steps, **args.extra)
    t0 = time.perf_counter()
    try:
        model = PPO("MlpPolicy", venv, seed=seed, device="cpu", verbose=0, **hyper)
        model.learn(args.timesteps)
    finally:
        venv.close()  # both sides write their ledgers
    seconds = time.perf_counter() - t0
    if injector is not None:
        firsts = dict(injector.where.by_env)
    else:
        firsts = {}
        for i in range(args.n_envs):
            rec = read_record(os.path.join(directory, "fault-%d.json" % i))
            if rec is not None:
                firsts[i] = rec
    return {"firsts": firsts, "report": compare(directory, trainer_file), "seconds": seconds,
            "steps": model.num_timesteps, "env_id": env_id}


def verdict(r):
    """'located', 'caught' (not located), 'missed', 'no opportunity', or for controls 'clean'/'differs'."""
    report, firsts = r["report"], r["firsts"]
    if r["fault"] is None:
        return "clean" if report.ok else "differs"
    if not firsts:
        return "no opportunity" if report.ok else "differs without a fault"
    if report.ok:
        return "missed"
    by_env = report.by_env()
    located = all(is_located(by_env.get(env), first) for env, first in firsts.items())
    untouched = set(by_env) - set(firsts)  # an env the injector never changed must compare clean
    return "located" if located and not untouched else "caught"


def describe(r):
    """One line per run: where the fault went in and what compare said about that env."""
    firsts, by_env = r["firsts"], r["report"].by_env()
    if r["fault"] is None:
        return "clean" if r["report"].ok else "DIFFERS: " + "; ".join(d.line() for d in r["report"].differences)
    if not firsts:
        return "no opportunity (the fault never changed a value)" + (
            "" if r["report"].ok else "; compare: " + "; ".join(d.line() for d in r["report"].differences))
    env = min(firsts)
    f = firsts[env]
    where = "env %d, episode %d, step %d" % (env, f["episode"], f["step"])
    more = " (+%d more envs)" % (len(firsts) - 1) if len(firsts) > 1 else ""
    if r["verdict"] == "located":
        return "caught and located: %s%s" % (where, more)
    lines = ["%s: injected at %s%s" % (r["verdict"].upper(), where, more)]
    for e in sorted(set(firsts) | set(by_env)):
        d = by_env.get(e)
        if e in firsts and d is not None and is_located(d, firsts[e]):
            continue
        inj = firsts.get(e)
        lines.append("    env %d: injected %s; compare said: %s" % (
            e, "at episode %d, step %d (%s)" % (inj["episode"], inj["step"], inj["field"]) if inj else "nothing",
            d.line() if d is not None else "no difference"))
    return "\n".join(lines)


def cell(results):
    """'caught and located / runs', with runs that met no opportunity noted apart."""
    if not results:
        return ""
    exercised = [r for r in results if r["verdict"] != "no opportunity"]
    text = "%d/%d" % (sum(r["verdict"] == "located" for r in exercised), len(exercised))
    idle = len(results) - len(exercised)
    return text + (" (+%d no opportunity)" % idle if idle else "")


def table(results, args, seconds):
    doses = args.doses
    rows = ["| fault | env | " + " | ".join(DOSE_NAMES.get(d, d) for d in doses) + " |",
            "| --- | --- | " + " | ".join("---" for _ in doses) + " |"]
    for fault in args.faults:
        env_id = env_for(fault)
        rows.append("| %s | %s | %s |" % (fault, env_id, " | ".join(
            cell([r for r in results if r["fault"] == fault and r["dose"] == d]) for d in doses)))

    def total(faults):
        rs = [r for r in results if r["fault"] in faults]
        ex = [r for r in rs if r["verdict"] != "no opportunity"]
        return sum(r["verdict"] == "located" for r in ex), len(ex), len(rs) - len(ex)

    lines = []
    ok, n, idle = total(set(args.faults) & set(PAPER_FAULTS))
    if n or idle:
        lines.append("%d of %d boundary-fault runs caught and located on Pendulum-v1 (paper: 189 of 189 on "
                     "Pendulum)%s." % (ok, n, "; %d more met no opportunity" % idle if idle else ""))
    ok, n, idle = total(set(args.faults) & set(TERMINATING))
    if n or idle:
        lines.append("%d of %d runs of %s caught and located on CartPole-v1 (not in the paper's Fig. 6; Pendulum "
                     "never terminates)%s." % (ok, n, " and ".join(f for f in TERMINATING if f in args.faults),
                                                "; %d more met no opportunity" % idle if idle else ""))
    for env_id in sorted({r["env_id"] for r in results if r["fault"] is None}, reverse=True):  # Pendulum first
        cs = [r for r in results if r["fault"] is None and r["env_id"] == env_id]
        lines.append("%d of %d fault-free runs clean on %s." % (sum(r["verdict"] == "clean" for r in cs), len(cs),
                                                                env_id))
    bad = [r for r in results if r["verdict"] not in ("located", "clean", "no opportunity")]
    steps = sorted({r["steps"] for r in results})
    out = ["## Detection under PPO (benchmarks/detection.py)", "",
           "%s; torch %s, stable-baselines3 %s." % (machine(), torch.__version__,
                                                    __import__("stable_baselines3").__version__), "",
           "SB3 PPO through SubprocVecEnv, %d envs, %s timesteps a run, seeds %s: rl-baselines3-zoo's Pendulum-v1 "
           "settings with n_steps %d%s; torch on one thread. Pendulum-v1 with a %s-step time limit, so that "
           "episode-end faults meet opportunities. Env-side faults by FaultyEnv outside LedgerEnv in each "
           "worker; swaps by FaultyVecEnv between the SubprocVecEnv and LedgerVecEnv. Dose one: env %d, first "
           "opportunity at or after its step %d; 1%%: cells drawn with fault seed %d, the same at every "
           "training seed. Each cell: runs caught and located (compare's first difference, for every env the "
           "fault changed, at the injected episode, step and field; every other env clean) / runs in which "
           "the fault changed a value." % (
               args.n_envs, "/".join(f"{s:,}" for s in steps), ", ".join(map(str, args.seeds)), args.n_steps,
               (", " + ", ".join("%s=%s" % kv for kv in args.extra.items())) if args.extra else "",
               args.max_episode_steps, args.target, args.at, args.fault_seed), ""]
    if set(args.faults) & set(TERMINATING):
        out += ["terminated:drop and terminated:as-trunc run on CartPole-v1 (its own 500-step limit; the same PPO "
                "settings without gSDE, which SB3 offers for Box actions only), because Pendulum never "
                "terminates: there they would meet no opportunity.", ""]
    out += rows + [""] + lines
    if bad:
        out += ["", "Not caught and located:", "", "```"]
        out += ["%s, dose %s, seed %d: %s" % (r["fault"] or "fault-free", r["dose"], r["seed"], r["line"])
                for r in bad] + ["```"]
    out += ["", "Whole run: %.0f s (%d runs)." % (seconds, len(results))]
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timesteps", type=int, default=4096, help="timesteps a run (rounded up to whole rollouts)")
    p.add_argument("--n-envs", type=int, default=8, help="envs in the SubprocVecEnv")
    p.add_argument("--n-steps", type=int, default=256, help="PPO's n_steps (rl-zoo: 1024)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--faults", nargs="+", default=list(FAULTS), metavar="FAULT",
                   help="faults to run (default: all %d: %s)" % (len(FAULTS), ", ".join(FAULTS)))
    p.add_argument("--doses", nargs="+", default=list(DOSES), metavar="DOSE",
                   help="doses: one, a fraction such as 0.01, all (default: one 0.01 all)")
    p.add_argument("--max-episode-steps", type=int, default=50, help="Pendulum-v1's time limit (its usual: 200)")
    p.add_argument("--at", type=int, default=None,
                   help="dose one: the target env's first step that may be hit (default: half its steps)")
    p.add_argument("--target", type=int, default=None, help="dose one: the env hit (default: the last)")
    p.add_argument("--fault-seed", type=int, default=0, help="the seed of the 1%% dose's cells")
    p.add_argument("--no-controls", action="store_true", help="skip the fault-free runs")
    p.add_argument("--start-method", default="fork", choices=("fork", "forkserver", "spawn"),
                   help="how SubprocVecEnv starts its workers")
    p.add_argument("--tmpdir", default=None, help="where the ledgers go (default: the system's temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep every run's ledgers (by default only those of runs "
                   "not caught and located are kept, and their directory printed)")
    p.add_argument("--no-write", action="store_true", help="print the table only, leave RESULTS.md alone")
    p.add_argument("--quick", action="store_true", help="a smoke run: faults %s, dose one, seed 0, 2 envs, "
                   "n_steps 64, 1 epoch, 256 timesteps; writes nothing" % " and ".join(QUICK_FAULTS))
    args = p.parse_args()
    args.extra = {}
    if args.quick:
        args.faults, args.doses, args.seeds = list(QUICK_FAULTS), ["one"], [0]
        args.timesteps, args.n_envs, args.n_steps, args.max_episode_steps = 256, 2, 64, 20
        args.extra = dict(n_epochs=1, batch_size=64)
    for f in args.faults:
        if f not in FAULTS:
            p.error("unknown fault %r; choose from %s" % (f, ", ".join(FAULTS)))
    for d in args.doses:
        if d not in ("one", "all"):
            try:
                assert 0 < float(d) <= 1
            except (ValueError, AssertionError):
                p.error("dose must be one, all or a fraction in (0, 1], got %r" % d)
    per_env = -(-args.timesteps // (args.n_envs * args.n_steps)) * args.n_steps  # whole rollouts
    args.at = per_env // 2 if args.at is None else args.at
    args.target = args.n_envs - 1 if args.target is None else args.target
    torch.set_num_threads(1)

    plan = []  # (env, fault, dose, seed); fault None: a fault-free control
    if not args.no_controls:
        for env_id in sorted({env_for(f) for f in args.faults}, reverse=True):  # Pendulum first
            plan += [(env_id, None, "-", seed) for seed in args.seeds]
    plan += [(env_for(f), f, d, s) for f in args.faults for d in args.doses for s in args.seeds]
    started = time.perf_counter()
    results = []
    for k, (env_id, fault, dose, seed) in enumerate(plan):
        d = tempfile.mkdtemp(prefix="stepledger-detection-", dir=args.tmpdir)
        with warnings.catch_warnings():
            if fault is not None:
                warnings.simplefilter("ignore")  # e.g. gymnasium's step-after-done, expected with faulty flags
            r = run(env_id, fault, dose, seed, args, d)
        r.update(fault=fault, dose=dose, seed=seed)
        r["verdict"] = verdict(r)
        r["line"] = describe(r)
        keep = args.keep or r["verdict"] not in ("located", "clean", "no opportunity")
        if keep:
            r["line"] += "\n    ledgers: %s" % d
        else:
            shutil.rmtree(d, ignore_errors=True)
        results.append(r)
        elapsed = time.perf_counter() - started
        print("[%d/%d] %s %s, dose %s, seed %d: %s (%.1f s; %.0f s so far, about %.0f s to go)" % (
            k + 1, len(plan), env_id, fault or "fault-free", dose, seed, r["line"], r["seconds"], elapsed,
            elapsed / (k + 1) * (len(plan) - k - 1)), file=sys.stderr, flush=True)
    show("detection", table(results, args, time.perf_counter() - started), write=not (args.quick or args.no_write))


if __name__ == "__main__":
    main()
