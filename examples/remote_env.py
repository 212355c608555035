"""Environments on one machine, the trainer on another, with a ledger on each side.

The env server hosts N environments, each wrapped in LedgerEnv in the
server's own process (the env side). The trainer talks to it through
RemoteVectorEnv, a Gymnasium vector env with NEXT_STEP autoreset (the step
after an episode end resets that env instead of stepping it, exactly as
Gymnasium's own vector envs do by default), wrapped in LedgerVectorEnv (the
trainer side). Everything between the two wrappers, here the network bridge,
is what compare checks. Run one command per host:

    # host A, the environments:
    python examples/remote_env.py --serve 0.0.0.0:6000 --dir env-ledgers --num-envs 4
    # host B, the trainer:
    python examples/remote_env.py --connect HOST_A:6000 --trainer-file trainer.npz --steps 200
    # bring host A's env-ledgers/ to host B (scp -r, rsync, shared storage), then:
    stepledger compare env-ledgers trainer.npz

The server writes env-0.npz ... env-{N-1}.npz into --dir when the trainer
closes its vector env (the client sends a close message, the server closes
its envs, which writes their ledgers, and exits). With --fault, the server's
send path rounds one reward through float16 after LedgerEnv recorded it, as a
bridge that "compresses" its messages would; the server prints where, and
compare names that env, episode, step and field.

The transport is multiprocessing.connection (Listener and Client with an
authkey): it is in the standard library, so neither host needs an extra
dependency, it frames messages and authenticates both ends with an HMAC
challenge, which hand-made sockets would each have to get right again, and
unlike pyzmq with msgpack it needs no third-party package and no array
encoding scheme of its own. It pickles what it sends, so messages carry only
plain Python values: arrays go as (dtype, shape, bytes), because a NumPy 2
pickle cannot be read by NumPy 1.x, and the two hosts rarely have the same
versions. The authkey authenticates, it does not encrypt, and anyone holding
it can make the server unpickle what they send: keep the server on a private
network or behind an SSH tunnel, and set your own key (--authkey or
STEPLEDGER_REMOTE_AUTHKEY) rather than the demo default.
"""

import argparse
import os
import sys
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Listener

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

import stepledger
from stepledger import LedgerEnv, LedgerVectorEnv

# Settings both hosts must share (both ledgers must record alike).
KEEP_VALUES = True  # keep observations and actions, so that a report prints both sides' values
DEFAULT_AUTHKEY = os.environ.get("STEPLEDGER_REMOTE_AUTHKEY", "stepledger-demo")
# With --fault: the reward of env 1 at episode 1, step 12 leaves the server rounded through float16.
FAULT_ENV, FAULT_EPISODE, FAULT_STEP = 1, 1, 12


# ---------------------------------------------------------------- the wire format
# Plain Python values only, so that any NumPy version on either host can read them.

def pack(value):
    if isinstance(value, np.ndarray):
        return ("__ndarray__", value.dtype.str, value.shape, np.ascontiguousarray(value).tobytes())
    if isinstance(value, np.generic):
        return ("__ndarray__", value.dtype.str, (), value.tobytes())
    if isinstance(value, dict):
        return {k: pack(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(pack(v) for v in value)
    return value


def unpack(value):
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "__ndarray__":
        _, dtype, shape, data = value
        array = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()
        return array[()] if shape == () else array
    if isinstance(value, dict):
        return {k: unpack(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(unpack(v) for v in value)
    return value


def describe_space(space):
    """A space as plain values (a pickled space would carry the sender's NumPy and Gymnasium)."""
    if isinstance(space, spaces.Box):
        return ("Box", pack(space.low), pack(space.high), space.dtype.str)
    if isinstance(space, spaces.Discrete):
        return ("Discrete", int(space.n), int(space.start))
    if isinstance(space, spaces.MultiDiscrete):
        return ("MultiDiscrete", pack(space.nvec), space.dtype.str, pack(space.start))
    if isinstance(space, spaces.MultiBinary):
        return ("MultiBinary", pack(np.asarray(space.n)))
    if isinstance(space, spaces.Dict):
        return ("Dict", [(k, describe_space(s)) for k, s in space.spaces.items()])
    if isinstance(space, spaces.Tuple):
        return ("Tuple", [describe_space(s) for s in space.spaces])
    raise TypeError("remote_env.py: cannot send a %s over the wire" % type(space).__name__)


def build_space(desc):
    kind, *rest = desc
    if kind == "Box":
        low, high, dtype = rest
        return spaces.Box(unpack(low), unpack(high), dtype=np.dtype(dtype))
    if kind == "Discrete":
        return spaces.Discrete(rest[0], start=rest[1])
    if kind == "MultiDiscrete":
        return spaces.MultiDiscrete(unpack(rest[0]), dtype=np.dtype(rest[1]), start=unpack(rest[2]))
    if kind == "MultiBinary":
        n = unpack(rest[0])
        return spaces.MultiBinary(int(n) if n.ndim == 0 else n.tolist())
    if kind == "Dict":
        return spaces.Dict({k: build_space(d) for k, d in rest[0]})
    return spaces.Tuple([build_space(d) for d in rest[0]])


def parse_address(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


# ---------------------------------------------------------------- host A: the env server

def make_env(env_id, index, directory, max_episode_steps):
    env = gym.make(env_id, max_episode_steps=max_episode_steps)
    return LedgerEnv(env, directory, index=index, keep_values=KEEP_VALUES)  # outermost: all that leaves is checked


def accept(listener):
    """The trainer's connection; a client with the wrong authkey is turned away and the server waits on."""
    while True:
        try:
            return listener.accept()
        except (AuthenticationError, EOFError, ConnectionError) as exc:
            print("rejected a connection: %s" % (exc or type(exc).__name__), flush=True)


def serve(args):
    envs = [make_env(args.env_id, i, args.dir, args.max_episode_steps) for i in range(args.num_envs)]
    n = len(envs)
    autoreset = [False] * n  # NEXT_STEP: this env's episode ended at the last step, reset it at the next one
    episode, step = [-1] * n, [0] * n  # where each env is, counted as compare counts (for the fault's message)
    fault_pending = args.fault
    listener = Listener(parse_address(args.serve), authkey=args.authkey.encode())
    host, port = listener.address
    print("serving %d x %s on %s:%d, env ledgers to %s (stepledger %s core, numpy %s, gymnasium %s)"
          % (n, args.env_id, host, port, args.dir, stepledger.CORE, np.__version__, gym.__version__), flush=True)
    try:
        with accept(listener) as conn:
            while True:
                try:
                    command, payload = conn.recv()
                except EOFError:
                    print("the trainer hung up without closing; writing the ledgers anyway", flush=True)
                    break
                if command == "spaces":
                    conn.send((n, describe_space(envs[0].observation_space), describe_space(envs[0].action_space)))
                elif command == "reset":
                    seed, mask = payload
                    results = []
                    for i, env in enumerate(envs):
                        if mask is not None and not mask[i]:
                            results.append(None)
                            continue
                        obs, info = env.reset(seed=None if seed is None else seed + i)
                        autoreset[i], episode[i], step[i] = False, episode[i] + 1, 0
                        results.append((obs, info))
                    conn.send(pack(results))
                elif command == "step":
                    results = []
                    for i, (env, action) in enumerate(zip(envs, unpack(payload))):
                        if autoreset[i]:  # the action is ignored, as in Gymnasium's NEXT_STEP
                            obs, info = env.reset()
                            reward, terminated, truncated = 0.0, False, False
                            episode[i], step[i] = episode[i] + 1, 0
                        else:
                            obs, reward, terminated, truncated, info = env.step(action)
                            step[i] += 1
                        autoreset[i] = bool(terminated or truncated)
                        # The send path: anything changed from here on is a boundary fault.
                        if fault_pending and (i, episode[i], step[i]) == (FAULT_ENV, FAULT_EPISODE, FAULT_STEP):
                            sent = float(np.float16(reward))
                            print("fault: env %d, episode %d, step %d: reward sent as %r instead of %r"
                                  % (i, episode[i], step[i], sent, float(reward)), flush=True)
                            reward, fault_pending = sent, False
                        results.append((obs, float(reward), bool(terminated), bool(truncated), info))
                    conn.send(pack(results))
                elif command == "close":
                    break
                else:
                    raise ValueError("unknown command %r" % (command,))
            for env in envs:
                env.close()  # writes env-{i}.npz
            envs = []
            try:
                conn.send("closed")
            except OSError:
                pass
    finally:
        for env in envs:
            env.close()
        listener.close()
    if fault_pending:
        print("fault: never reached env %d, episode %d, step %d; nothing was changed"
              % (FAULT_ENV, FAULT_EPISODE, FAULT_STEP), flush=True)
    print("wrote %d env ledgers to %s" % (n, args.dir), flush=True)


# ---------------------------------------------------------------- host B: the trainer

class RemoteVectorEnv(gym.vector.VectorEnv):
    """A Gymnasium vector env whose envs run on the env server, with NEXT_STEP autoreset."""

    def __init__(self, address, authkey, connect_timeout=30.0):
        deadline = time.monotonic() + connect_timeout
        while True:  # the server may still be starting
            try:
                self.conn = Client(address, authkey=authkey)
                break
            except AuthenticationError as exc:
                raise ConnectionError("the env server at %s:%d refused the authkey: give both hosts the same "
                                      "--authkey or STEPLEDGER_REMOTE_AUTHKEY" % address) from exc
            except OSError as exc:  # refused or unreachable: retry until the deadline
                if time.monotonic() > deadline:
                    raise ConnectionError("no env server at %s:%d (%s)" % (address[0], address[1], exc)) from exc
                time.sleep(0.2)
        self.conn.send(("spaces", None))
        n, obs_desc, act_desc = self.conn.recv()
        self.num_envs = n
        self.single_observation_space = build_space(obs_desc)
        self.single_action_space = build_space(act_desc)
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        autoreset_mode = getattr(gym.vector, "AutoresetMode", None)  # Gymnasium 1.1 and later
        self.metadata = {"autoreset_mode": autoreset_mode.NEXT_STEP if autoreset_mode else "NextStep"}
        self._obs = create_empty_array(self.single_observation_space, n)

    def reset(self, *, seed=None, options=None):
        mask = None
        if options and options.get("reset_mask") is not None:  # reset only these envs, as Gymnasium does
            mask = [bool(m) for m in options.pop("reset_mask")]
        self.conn.send(("reset", (seed, mask)))
        results = unpack(self.conn.recv())
        rows = list(iterate(self.observation_space, self._obs))  # envs outside the mask keep their observation
        infos = {}
        for i, result in enumerate(results):
            if result is not None:
                rows[i] = result[0]
                infos = self._add_info(infos, result[1], i)
        self._obs = concatenate(self.single_observation_space, rows,
                                create_empty_array(self.single_observation_space, self.num_envs))
        return _copy(self._obs), infos

    def step(self, actions):
        self.conn.send(("step", pack(list(iterate(self.action_space, actions)))))
        obs, rewards, terminated, truncated, infos = zip(*unpack(self.conn.recv()))
        self._obs = concatenate(self.single_observation_space, obs,
                                create_empty_array(self.single_observation_space, self.num_envs))
        merged = {}
        for i, info in enumerate(infos):
            merged = self._add_info(merged, info, i)
        return (_copy(self._obs), np.array(rewards, dtype=np.float64), np.array(terminated, dtype=np.bool_),
                np.array(truncated, dtype=np.bool_), merged)

    def close_extras(self, **kwargs):
        try:
            self.conn.send(("close", None))
            self.conn.recv()  # "closed": the server has written its ledgers
        except (EOFError, OSError):
            pass
        self.conn.close()


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_copy(v) for v in value)
    return np.array(value, copy=True)


def train(args):
    envs = RemoteVectorEnv(parse_address(args.connect), args.authkey.encode(), args.connect_timeout)
    envs = LedgerVectorEnv(envs, args.trainer_file, keep_values=KEEP_VALUES,
                           autoreset_mode="next_step")  # innermost on the trainer side; a bridge must say its mode
    print("connected to %s: %d envs (stepledger %s core, numpy %s, gymnasium %s)"
          % (args.connect, envs.num_envs, stepledger.CORE, np.__version__, gym.__version__), flush=True)
    envs.action_space.seed(args.seed)  # a stand-in for a policy: seeded random actions
    envs.reset(seed=args.seed)
    for _ in range(args.steps):
        envs.step(envs.action_space.sample())
    envs.close()  # writes the trainer ledger, then tells the server to write the env ledgers
    print("wrote %s; bring the server's env ledgers here, then run: stepledger compare ENV_DIR %s"
          % (args.trainer_file, args.trainer_file), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    role = parser.add_mutually_exclusive_group(required=True)
    role.add_argument("--serve", metavar="HOST:PORT",
                      help="run the env server, listening on HOST:PORT (0.0.0.0 for every interface; port 0 picks "
                           "a free port and prints it)")
    role.add_argument("--connect", metavar="HOST:PORT", help="run the trainer against the env server at HOST:PORT")
    parser.add_argument("--authkey", default=DEFAULT_AUTHKEY,
                        help="shared secret of the two hosts (default: $STEPLEDGER_REMOTE_AUTHKEY, else a demo key)")
    server = parser.add_argument_group("server (--serve)")
    server.add_argument("--dir", default="env-ledgers",
                        help="where the env ledgers env-N.npz go (default: %(default)s)")
    server.add_argument("--num-envs", type=int, default=4, help="environments to host (default: %(default)s)")
    server.add_argument("--env-id", default="Pendulum-v1", help="Gymnasium env id (default: %(default)s)")
    server.add_argument("--max-episode-steps", type=int, default=50, help="time limit (default: %(default)s)")
    server.add_argument("--fault", action="store_true",
                        help="round the reward of env %d at episode %d, step %d through float16 on the send path, "
                             "after LedgerEnv recorded it; compare must name it" % (FAULT_ENV, FAULT_EPISODE,
                                                                                     FAULT_STEP))
    trainer = parser.add_argument_group("trainer (--connect)")
    trainer.add_argument("--trainer-file", default="trainer.npz", help="the trainer ledger (default: %(default)s)")
    trainer.add_argument("--steps", type=int, default=200, help="vector steps (default: %(default)s)")
    trainer.add_argument("--seed", type=int, default=0, help="reset seed and action seed (default: %(default)s)")
    trainer.add_argument("--connect-timeout", type=float, default=30.0,
                         help="seconds to keep retrying while the server starts (default: %(default)s)")
    args = parser.parse_args()
    for name in ("num_envs", "max_episode_steps", "steps"):
        if getattr(args, name) < 1:
            parser.error("--%s must be at least 1 (got %d)" % (name.replace("_", "-"), getattr(args, name)))
    if args.fault and args.num_envs <= FAULT_ENV:
        parser.error("--fault changes a reward of env %d, so it needs --num-envs %d or more (got %d)"
                     % (FAULT_ENV, FAULT_ENV + 1, args.num_envs))
    if args.fault and args.max_episode_steps < FAULT_STEP:
        parser.error("--fault changes step %d of an episode, so it needs --max-episode-steps %d or more (got %d)"
                     % (FAULT_STEP, FAULT_STEP, args.max_episode_steps))
    if args.serve:
        serve(args)
    else:
        train(args)


if __name__ == "__main__":
    sys.exit(main())
