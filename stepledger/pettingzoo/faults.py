"""PettingZoo's fault injectors: ``FaultyParallelEnv``, on one agent of a parallel env, outside ``LedgerParallelEnv``;
``FaultyAECEnv``, on one agent of a turn-based env, outside ``LedgerAECEnv``.

It drives the library-free ``stepledger.faults.FaultEngine``; docs/FAULTS.md has the faults and doses.
"""

from pettingzoo.utils import BaseParallelWrapper, BaseWrapper

from stepledger.faults.engine import MULTIAGENT_FAULTS, TURN_FAULTS, FaultEngine, Injector, zeros_like
from stepledger.recording.placement import own_attr


class FaultyParallelEnv(Injector, BaseParallelWrapper):
    """Injects one multi-agent boundary fault on one agent of a PettingZoo parallel env.

    It goes outside ``LedgerParallelEnv`` and inside any SuperSuit wrapper
    (the faults happen on the env's side of the boundary):
    ``FaultyParallelEnv(LedgerParallelEnv(par_env, d), "reward:drop", agent="agent_1", target=1)``.
    The engine keeps one stream per agent (its positions are the env
    ledger's); the record names the env copy, the agent and its stream.

    Args:
        env: the parallel env, already wrapped in LedgerParallelEnv.
        fault: one of ``MULTIAGENT_FAULTS``.
        index: the env copy's index; None: the LedgerParallelEnv's at the first reset.
        agent: the agent that is hit (None: the first agent of copy ``target`` that has an opportunity).
        dose, at, target, seed: as for FaultyEnv (``at`` counts the agent's steps).
        record: a JSON file to write where the fault first changed a value; ``{env}`` in it is replaced
            by the copy's index (SuperSuit's copies are built from one env: one file each).
    """

    def __init__(self, env, fault, index=None, agent=None, dose="one", at=10, target=0, seed=0, record=None):
        super().__init__(env)
        self._possible = list(env.possible_agents)
        if agent is not None and agent not in self._possible:
            raise ValueError("FaultyParallelEnv: agent %r is not one of possible_agents %r"
                             % (agent, self._possible))
        self.index = None if index is None else int(index)
        self.engine = FaultEngine(fault, dose, at, target, seed, record, env.action_space(self._possible[0]),
                                  target_agent=agent, allowed=MULTIAGENT_FAULTS, owner="FaultyParallelEnv")
        self.engine.where.agents = self._possible
        self._padded = {}     # agent -> (terminated, truncated, final obs): it left, the trainer was not told
        self._pending = None  # final-obs:reset: the reset made at the end, handed on at the next reset()

    @property
    def agents(self):
        live = set(self.env.agents) | set(self._padded)
        return [a for a in self._possible if a in live]

    def reset(self, seed=None, options=None):
        if self._pending is not None and seed is None and options is None:
            (obs, infos), self._pending = self._pending, None  # the reset made at the last end
        else:
            self._pending = None
            obs, infos = self.env.reset(seed=seed, options=options)
        if self.index is None:
            self.index = _ledger_index(self.env)
        if self.where.record and "{env}" in self.where.record:
            self.where.record = self.where.record.replace("{env}", str(self.index))
        self._padded = {}
        for agent, value in obs.items():
            self.engine.reset(self.index, value, agent=agent)
        return obs, infos

    def step(self, actions):
        engine, i, padded = self.engine, self.index, self._padded
        acting = [a for a in actions if a not in padded and a in self.env.agents]
        obs, rewards, terms, truncs, infos = self.env.step({a: engine.action(i, actions[a], agent=a)
                                                            for a in acting})
        over = not self.env.agents  # every agent is out: the caller resets next
        if over and self.way == "reset":
            self._pending = self.env.reset()  # the reset the caller makes next, made now for its obs
        out = [dict(obs), dict(rewards), dict(terms), dict(truncs), dict(infos)]
        events = [(obs.get(a), rewards.get(a, 0.0), bool(terms.get(a, False)), bool(truncs.get(a, False)))
                  for a in acting]
        for k, a in enumerate(acting):
            new, struck = engine._close(i, *events[k], self._other(a, k, acting, events, over), a)
            if struck:
                self._send(out, a, events[k], new)
        for a in obs:
            if a not in acting and a not in padded:  # joined this step: its first obs
                engine.reset(i, obs[a], agent=a)
        for a, (te, tr, final) in list(padded.items()):
            if a not in acting:  # a step the env never took: zeros, reward 0, no end until every agent is out
                out[0][a], out[1][a], out[4][a] = zeros_like(final), 0.0, {}
                out[2][a], out[3][a] = (te, tr) if over else (False, False)
        if over:
            padded.clear()
        return tuple(out)

    def _other(self, a, k, acting, events, over):
        """What the engine may put in agent a's place: the next agent's event (swap), its event with the end
        hidden (pad, where it leaves while others go on), the reset's obs (final-obs:reset); else None."""
        obs, reward, te, tr = events[k]
        if self.fault == "agent:swap" and len(acting) > 1:
            return events[(k + 1) % len(acting)]
        if self.fault == "agent:pad" and (te or tr) and not over:
            return obs, reward, False, False
        if self.fault == "final-obs:reset" and self._pending is not None and a in self._pending[0]:
            return self._pending[0][a], reward
        return None

    def _send(self, out, a, event, new):
        obs, rewards, terms, truncs, infos = out
        obs[a], rewards[a], terms[a], truncs[a] = new
        if self.fault == "reward:drop":
            del rewards[a]
        elif self.fault == "agent:pad":
            self._padded[a] = (event[2], event[3], new[0])
        elif (new[2] or new[3]) and not (event[2] or event[3]):  # a step made an end: its obs is the final obs
            infos[a] = dict(infos.get(a) or {}, terminal_observation=new[0])


def _ledger_index(env):
    """The index of the LedgerParallelEnv inside ``env``, once it has one; a one-line error otherwise."""
    while env is not None:
        if hasattr(env, "set_index") and hasattr(env, "ledger_path"):
            if env.index is None:
                break
            return int(env.index)
        env = own_attr(env, "env")
    raise ValueError("FaultyParallelEnv: no index= and no LedgerParallelEnv inside that knows its index at the "
                     "first reset; give FaultyParallelEnv index= or the LedgerParallelEnv its index")


class FaultyAECEnv(Injector, BaseWrapper):
    """Injects one boundary fault on one agent of a PettingZoo turn-based (AEC) env, outside ``LedgerAECEnv``.

    ``FaultyAECEnv(LedgerAECEnv(aec_env, d, index=0), "reward:others", agent="player_1")``: the faults
    reach a trainer that reads ``last()`` (the ``agent_iter`` loop, Tianshou's ``PettingZooEnv``). An
    agent's first turn is its reset; each of its later turns closes the step its action opened, and the
    engine strikes there (``at`` counts the agent's steps). Besides ``TURN_FAULTS``' value and flag faults:
    ``reward:others`` hands the agent only the reward its own move gave (what other agents' moves gave it
    since is dropped, Tianshou issue 399's class), ``reward:ender`` gives the agent whose move ended the game
    reward 0 at its last turn (RLlib PR 31156's class), and ``agent:no-last`` never hands a leaving agent
    its last turn: the injector takes its ``None`` step itself.

    Args:
        env: the AEC env, already wrapped in LedgerAECEnv.
        fault: one of ``TURN_FAULTS``.
        index, agent, dose, at, target, seed, record: as for ``FaultyParallelEnv``.
    """

    def __init__(self, env, fault, index=None, agent=None, dose="one", at=2, target=0, seed=0, record=None):
        super().__init__(env)
        self._possible = list(env.possible_agents)
        if agent is not None and agent not in self._possible:
            raise ValueError("FaultyAECEnv: agent %r is not one of possible_agents %r" % (agent, self._possible))
        self.index = None if index is None else int(index)
        self.engine = FaultEngine(fault, dose, at, target, seed, record, env.action_space(self._possible[0]),
                                  target_agent=agent, allowed=TURN_FAULTS, owner="FaultyAECEnv")
        self.engine.where.agents = self._possible
        self._seen, self._open, self._own, self._given = set(), set(), {}, {}
        self._mover = None

    def reset(self, seed=None, options=None, **kwargs):
        self.env.reset(seed=seed, options=options, **kwargs)
        if self.index is None:
            self.index = _ledger_index(self.env)
        if self.where.record and "{env}" in self.where.record:
            self.where.record = self.where.record.replace("{env}", str(self.index))
        self._seen, self._open, self._own, self._given = set(), set(), {}, {}
        self._mover = None

    def last(self, observe=True):
        agent = self.env.agent_selection
        given = self._given.get(agent)
        if given is not None:  # the same turn asked for again
            return given
        obs, reward, te, tr, info = self.env.last(observe)
        engine, i = self.engine, self.index
        if agent not in self._seen:
            self._seen.add(agent)
            engine.reset(i, obs, agent=agent)
        elif agent in self._open:
            self._open.discard(agent)
            other = None
            if self.fault == "reward:others":
                other = (obs, self._own.get(agent, 0.0))
            elif self.fault == "reward:ender" and agent == self._mover:
                other = (obs, 0.0)
            obs, reward, te, tr = engine.step(i, obs, reward, te, tr, other=other, agent=agent)
        self._given[agent] = given = (obs, reward, te, tr, info)
        return given

    def step(self, action):
        env = self.env
        agent = env.agent_selection
        if agent not in self._given:
            self.last()  # a turn taken without last(): the engine follows it all the same
        self._given.pop(agent, None)
        if action is not None:
            action = self.engine.action(self.index, action, agent=agent)
            self._open.add(agent)
            self._mover = agent
        env.step(action)
        if action is not None:
            self._own[agent] = env.rewards.get(agent, 0.0)
        if self.fault == "agent:no-last":
            self._skip_last_turns()

    def _skip_last_turns(self):
        """agent:no-last: a leaving agent whose step the dose draws is stepped with None here, its turn unseen."""
        env, engine, i = self.env, self.engine, self.index
        while env.agents:
            agent = env.agent_selection
            if agent not in self._open or not (env.terminations.get(agent) or env.truncations.get(agent)):
                return
            s = engine._open(i, agent)
            if not s.drawn:
                return
            env.last()  # the env side records the turn, which the trainer never gets
            engine._hit(s, i, agent, ["kind"])  # the trainer never gets that step: the next game starts for it
            s.open = False
            self._open.discard(agent)
            env.step(None)
