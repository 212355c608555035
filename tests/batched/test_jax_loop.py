"""A JAX simulator stepped by hand through the engine (EnvLedger), done flags only, the final observation
kept by stepping without autoreset and resetting where done: Gymnasium's functional JAX CartPole in the
test venv, and gymnax's (docs/BATCHED.md's example) in a side venv, since gymnax pins an older Gymnasium."""

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from side_venv import cached_venv, imported_version
from stepledger import EnvLedger, TrainerLedger, compare, read

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _functional_loop(d, n=64, steps=150, lose_final=False):
    jax = pytest.importorskip("jax")
    pytest.importorskip("flax")
    import jax.numpy as jnp
    from gymnasium.envs.phys2d.cartpole import CartPoleFunctional
    f = CartPoleFunctional()
    params = f.get_default_params()
    init = jax.jit(jax.vmap(lambda k: f.initial(k, params)))
    trans = jax.jit(jax.vmap(lambda s, a, k: f.transition(s, a, k, params)))
    obs_of = jax.jit(jax.vmap(lambda s, k: f.observation(s, k, params)))
    term_of = jax.jit(jax.vmap(lambda s, k: f.terminal(s, k, params)))
    env = EnvLedger(d, n, f.observation_space, f.action_space, autoreset_mode="same_step")
    tr = TrainerLedger(os.path.join(d, "trainer.npz"), n, f.observation_space, f.action_space,
                       autoreset_mode="same_step")
    env.link(tr.run)
    key = jax.random.key(0)
    state = init(jax.random.split(key, n))
    obs = obs_of(state, jax.random.split(key, n))
    env.reset(obs)
    tr.reset(np.asarray(obs))
    for _ in range(steps):
        key, ka, kn = jax.random.split(key, 3)
        action = jax.random.randint(ka, (n,), 0, 2)
        env.actions(action)
        tr.actions(np.asarray(action))
        state = trans(state, action, jax.random.split(kn, n))
        final = obs_of(state, jax.random.split(kn, n))
        done = term_of(state, jax.random.split(kn, n))
        fresh = init(jax.random.split(kn, n))
        state = jnp.where(done[:, None], fresh, state)
        obs = jnp.where(done[:, None], obs_of(fresh, jax.random.split(kn, n)), final)
        reward = jnp.ones(n, jnp.float32)
        env.step_done_flags(obs, reward, done, final_obs=final)
        # the trainer side: the batch as NumPy (a host copy), the final observations where the episodes ended
        tr.step(np.asarray(obs), np.asarray(reward), np.asarray(done), np.zeros(n, bool),
                None if lose_final else np.asarray(final))
    env.close()
    tr.close()
    return compare(d, os.path.join(d, "trainer.npz"))


def test_functional_jax_cartpole_through_the_engine_compares_clean(tmp_path):
    report = _functional_loop(str(tmp_path))
    assert report.ok and len(report.envs) == 64, report.lines()
    with read(str(tmp_path / "env-0-63.npz")) as led:
        assert sum(int((s.columns["kind"] == 0).sum()) for s in led.streams.values()) > 64 + 20  # episodes ended


def test_final_observation_lost_on_the_way_is_located(tmp_path):
    with pytest.warns(UserWarning, match="recorded as missing"):
        report = _functional_loop(str(tmp_path), lose_final=True)
    assert not report.ok
    from stepledger import core
    with read(str(tmp_path / "trainer.npz")) as tr:
        for d in report.differences:  # at the end of an episode: the trainer's final observation is missing
            assert d.fields == ("obs",), d.line()
            assert int(tr.streams[d.env].columns["h_obs"][d.event]) == core.MISSING_DIGEST


GYMNAX_VENV = os.environ.get("STEPLEDGER_GYMNAX_VENV") or os.path.join(
    tempfile.gettempdir(), "stepledger-gymnax-venv-py%d%d" % sys.version_info[:2])

GYMNAX_SCRIPT = r'''
import sys, jax, jax.numpy as jnp, numpy as np, gymnax
from stepledger import EnvLedger, TrainerLedger, compare
d = sys.argv[1]
env, params = gymnax.make("CartPole-v1")
n = 128
obs_space = env.observation_space(params)
import gymnasium as gym
ospace = gym.spaces.Box(np.asarray(obs_space.low, np.float32), np.asarray(obs_space.high, np.float32), (4,), np.float32)
aspace = gym.spaces.Discrete(2)
led = EnvLedger(d, n, ospace, aspace, autoreset_mode="same_step")
tr = TrainerLedger(d + "/trainer.npz", n, ospace, aspace, autoreset_mode="same_step")
led.link(tr.run)
step = jax.jit(jax.vmap(env.step_env, in_axes=(0, 0, 0, None)))
reset = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))
key = jax.random.key(0)
obs, state = reset(jax.random.split(key, n), params)
led.reset(obs); tr.reset(np.asarray(obs))
for t in range(300):
    key, k_act, k_step, k_reset = jax.random.split(key, 4)
    action = jax.random.randint(k_act, (n,), 0, 2)
    led.actions(action); tr.actions(np.asarray(action))
    final, state, reward, done, _ = step(jax.random.split(k_step, n), state, action, params)
    new_obs, new_state = reset(jax.random.split(k_reset, n), params)
    obs = jnp.where(done[:, None], new_obs, final)
    state = jax.tree.map(lambda a, b: jnp.where(done.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new_state, state)
    led.step_done_flags(obs, reward, done, final_obs=final)
    tr.step(np.asarray(obs), np.asarray(reward), np.asarray(done), np.zeros(n, bool), np.asarray(final))
led.close(); tr.close()
r = compare(d, d + "/trainer.npz")
print("ok" if r.ok else "\n".join(r.lines()))
'''


# The gymnax venv takes 140 to 280 s to build on 2 cores (a fresh CI machine builds it), more than tests/batched
# may take: its test runs only with STEPLEDGER_LONG=1.
LONG = os.environ.get("STEPLEDGER_LONG") == "1"


@pytest.fixture(scope="session")
def gymnax_python():
    if not LONG:
        pytest.skip("gymnax's side venv takes minutes to build: set STEPLEDGER_LONG=1 to run this test")
    # gymnax 1.0.1 imports six (gymnax.utils.load_mnist) without declaring it
    return cached_venv(GYMNAX_VENV, "stepledger-gymnax-ready", "gymnax and jax[cpu]",
                       [["gymnax==1.0.1", "jax[cpu]==0.10.2", "numpy", "six"]],
                       _gymnax_version, "1.0.1", install_timeout=900)


def _gymnax_version(python):
    """gymnax's version as the venv's Python has it installed (gymnax has no __version__), or None."""
    return imported_version(python, "gymnax, importlib.metadata as metadata; metadata.__version__ = "
                            "metadata.version('gymnax')", "metadata")


def test_gymnax_loop_from_the_docs_compares_clean(tmp_path, gymnax_python):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_") and k != "PYTHONPATH"}
    env.update(PYTHONPATH=REPO, STEPLEDGER_PUREPYTHON="1", JAX_PLATFORMS="cpu")
    out = subprocess.run([gymnax_python, "-c", GYMNAX_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ok", out.stdout
