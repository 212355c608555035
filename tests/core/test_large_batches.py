"""Batches of large observations (frames) on the trainer side: the digests of a batch too large for the
stack are laid out in a scratch buffer that is kept between calls, so that a vector env that returns a
new obs array each step (SyncVectorEnv copies it) does not make each call fault in fresh pages."""

import resource
import threading

import numpy as np
import pytest

from stepledger import _fallback as F
from stepledger import core

pytestmark = pytest.mark.skipif(core.IMPLEMENTATION != "cython", reason="the compiled core is not built")


def _frames(n, shape, seed):
    return np.random.default_rng(seed).integers(0, 256, (n,) + shape, dtype=np.uint8)


@pytest.mark.parametrize("sizes", [((8, (224, 224, 3)), (4, (84, 84, 3)), (16, (84, 84, 3)), (8, (224, 224, 3))),
                                   ((3, (300, 17)), (12, (64, 64, 3)), (9, (2,)), (8, (128, 128, 4)))])
def test_a_kept_scratch_buffer_of_another_size_gives_the_reference_digests(sizes):
    """Growing, shrinking and growing again: each batch's digests are the pure-Python core's."""
    for k, (n, shape) in enumerate(sizes * 2):
        frames = _frames(n, shape, k)
        out = np.zeros(n, np.uint64)
        core.digest_rows([frames], out)
        want = np.zeros(n, np.uint64)
        F.digest_rows([frames], want)
        assert np.array_equal(out, want), (n, shape)


def test_threads_digesting_large_batches_at_once_get_their_own_digests():
    """The GIL is released while a large batch is digested: a second thread then finds the kept buffer
    taken and must use its own, never write into the first one's."""
    batches = [_frames(8, (224, 224, 3), seed) for seed in range(4)]
    want = []
    for b in batches:
        w = np.zeros(8, np.uint64)
        F.digest_rows([b], w)
        want.append(w)
    errors = []

    def work(i):
        out = np.zeros(8, np.uint64)
        for _ in range(40):
            core.digest_rows([batches[i]], out)
            if not np.array_equal(out, want[i]):
                errors.append(i)
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_new_obs_array_each_call_does_not_fault_in_new_scratch_pages():
    """8 frames of 224x224x3 (1.2 MB) copied afresh before each call, as SyncVectorEnv hands over a new
    array each step: with a scratch malloc'ed per call, each call faulted in some 550 pages (1.3 ms a call
    against 0.3 ms for the digests). Page faults are counted, not timed: the count does not move with the
    machine's load."""
    frames = _frames(8, (224, 224, 3), 0)
    out = np.zeros(8, np.uint64)
    for _ in range(3):
        core.digest_rows([frames.copy()], out)
    calls = 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        core.digest_rows([frames.copy()], out)
    per_call = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls
    pages = frames.nbytes // 4096  # the scratch spans as many pages as the batch
    assert per_call < pages / 4, (per_call, pages)
