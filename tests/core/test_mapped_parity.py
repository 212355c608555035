"""The mapped rings of StreamBuffer (format/mapped.py's stream regions): the compiled core and the pure-Python
reference leave the same bytes in the region after the same appends, let-gos, overflows and returns to the
ring, and the region names whole rows only, the same events the buffer holds."""

import mmap

import numpy as np
import pytest

from stepledger import _fallback as F
from stepledger.format import schema as S
from stepledger.format.mapped import region_bytes

C = pytest.importorskip("stepledger._core")

CAP = 64


def _ring_events(region, cap):
    """The events the region's header names, read as format/mapped.py's reader reads them."""
    hdr = np.frombuffer(region, np.uint64, 2, 0)
    base, end = int(hdr[0]), int(hdr[1])
    if base >= end:
        return base, []
    assert end - base <= cap
    rows = [(base + i) % cap for i in range(end - base)]
    cols, pos = {}, S.MAP_STREAM_HEADER
    for name in S.MAP_COLUMN_ORDER:
        dt = np.dtype(S.COLUMN_DTYPES[name])
        cols[name] = np.frombuffer(region, dt, cap, pos)[rows]
        pos += dt.itemsize * cap
    return base, list(zip(*(cols[n].tolist() for n in S.EVENT_COLUMN_NAMES)))


def _run(core, ops, cap=CAP):
    region = mmap.mmap(-1, region_bytes(cap))
    buf = core.StreamBuffer()
    buf.map_to(region, cap)
    truth = []  # every event appended, in order
    gone = 0
    checks = []
    for op, arg in ops:
        if op == "append":
            for _ in range(arg):
                g = len(truth)
                ev = (g % 2, (g * 2654435761) % (1 << 64), g + 7, (g * 40503) % (1 << 32), g % 5 == 0, g % 7 == 0)
                truth.append(ev)
                buf.append(*ev)
        elif op == "drop":
            k = min(arg, len(buf))
            buf.drop_front(k)
            gone += k
        elif op == "release":
            gone += len(buf)
            buf.release()
        held = list(zip(*(buf.columns()[n].tolist() for n in S.EVENT_COLUMN_NAMES)))
        views = list(zip(*(buf.views()[n].tolist() for n in S.EVENT_COLUMN_NAMES)))
        base, ring = _ring_events(region, cap)
        expect = [(k, h, a, r, te, tr and not te) for k, h, a, r, te, tr in truth]
        assert held == views == expect[gone:]
        assert buf.dropped == gone
        # the ring names whole rows of true events only, and never an event let go of before its base
        assert ring == expect[base: base + len(ring)]
        if buf.in_map:
            assert base == gone and len(ring) == len(held)
        checks.append((base, len(ring)))
    return bytes(region), checks


def _ops(seed):
    rng = np.random.default_rng(seed)
    ops = []
    for _ in range(60):
        r = rng.random()
        if r < 0.6:
            ops.append(("append", int(rng.integers(1, 40))))
        elif r < 0.9:
            ops.append(("drop", int(rng.integers(1, 60))))
        else:
            ops.append(("release", 0))
    return ops


@pytest.mark.parametrize("seed", range(12))
def test_rings_agree_byte_for_byte(seed):
    ops = _ops(seed)
    c_bytes, c_checks = _run(C, ops)
    f_bytes, f_checks = _run(F, ops)
    assert c_checks == f_checks
    assert c_bytes == f_bytes


def test_overflow_keeps_every_event_and_comes_back_to_the_ring():
    ops = [("append", CAP + 10), ("drop", 20), ("append", 5), ("drop", 40), ("append", 3)]
    for core in (C, F):
        _, checks = _run(core, ops)
        # full: the ring's header reads as empty (base = end), so that a reader never takes the CAP events it
        # held for a recording that stopped there; back in the ring once they fit
        assert checks[0] == (CAP, 0)
        assert checks[-1][1] == CAP + 10 - 20 + 5 - 40 + 3


def test_unmap_keeps_the_events_in_memory():
    for core in (C, F):
        region = mmap.mmap(-1, region_bytes(CAP))
        buf = core.StreamBuffer()
        buf.map_to(region, CAP)
        for g in range(10):
            buf.append(1, g + 1, 2, 3, False, False)
        buf.unmap()
        region[:] = bytes(len(region))
        assert buf.columns()["h_obs"].tolist() == list(range(1, 11))
        buf.append(1, 99, 2, 3, False, False)
        assert bytes(region) == bytes(len(region))  # no longer written


def test_half_full_ring_asks_for_a_spill():
    for core in (C, F):
        core.map_pressure(clear=True)
        region = mmap.mmap(-1, region_bytes(CAP))
        buf = core.StreamBuffer()
        buf.map_to(region, CAP)
        for g in range(CAP // 2):
            buf.append(1, g + 1, 2, 3, False, False)
        assert not core.map_pressure()
        buf.append(1, 1, 2, 3, False, False)
        assert core.map_pressure(clear=True)
        assert not core.map_pressure()
        buf.release()


@pytest.mark.parametrize("space", ["box", "discrete", "dict"])
def test_the_step_under_way_is_noted_alike(space):
    """EventRecorder notes the action of the step under way in the ring's header (its message, or its digest):
    the same bytes from both cores, and resolved once the step is recorded."""
    from gymnasium import spaces as gs
    from stepledger.format.spaces import LeafLayout
    sp = {"box": gs.Box(-2, 2, (2,), np.float32), "discrete": gs.Discrete(3),
          "dict": gs.Dict({"a": gs.Discrete(2), "b": gs.Box(0, 1, (1,), np.float32)})}[space]
    sp.seed(0)
    obs_layout, act_layout = LeafLayout(gs.Box(-1, 1, (3,), np.float32)), LeafLayout(sp)
    acts = [sp.sample() for _ in range(5)]
    regions = []
    for core in (C, F):
        region = mmap.mmap(-1, region_bytes(CAP))
        buf = core.StreamBuffer()
        buf.map_to(region, CAP)
        rec = core.EventRecorder(buf, obs_layout, act_layout, True)
        rec.reset(np.zeros(3, np.float32))
        for a in acts:
            rec.take_action(a)
            rec.step_taken(np.ones(3, np.float32), 1.0, False, False)
        rec.take_action(acts[0])  # and dies here
        regions.append(bytes(region))
        pending = int(np.frombuffer(region, np.uint64, 1, S.MAP_PENDING)[0])
        end = int(np.frombuffer(region, np.uint64, 1, S.MAP_END)[0])
        assert pending == end + 1
    assert regions[0] == regions[1]
