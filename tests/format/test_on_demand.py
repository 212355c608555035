"""Copies of a URL's ledgers filled as they are read (format/ondemand.py), as a Ray compare's driver and its tasks
make them: the same reading as a whole copy gives, what opening a ledger reads fetched and not its columns, and an
object that changes or goes while it is read named in one line. Against the suite's S3-compatible server."""

import testpaths  # noqa: F401  (where the suite and the repository are)
import os
import random
import uuid

import numpy as np
import pytest

import big_ledgers
from stepledger import compare, read
from stepledger.errors import LedgerError
from stepledger.format import ondemand
from stepledger.format.ledgerfile import LedgerFile
from stepledger.report.read import ON_DEMAND

FAULTS = {1: [(7, "reward")], 3: [(20_000, "obs")], 6: [(201, "truncated")]}


@pytest.fixture(scope="module")
def bucket(s3_server):
    """The suite's S3 server, this process's s3fs pointed at it."""
    import fsspec.config
    old = {k: os.environ.get(k) for k in s3_server.environ()}
    old_conf = fsspec.config.conf.get("s3")
    os.environ.update(s3_server.environ())
    fsspec.config.conf["s3"] = s3_server.options()
    try:
        yield s3_server, s3_server.make_bucket("ondemand-" + uuid.uuid4().hex[:10])
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if old_conf is None:
            fsspec.config.conf.pop("s3", None)
        else:
            fsspec.config.conf["s3"] = old_conf


@pytest.fixture(scope="module")
def run(bucket, tmp_path_factory):
    """A faulty run of 8 envs x 100,000 events, on disk and uploaded: (env dir, trainer, env URL, trainer URL)."""
    server, name = bucket
    env_dir, trainer = big_ledgers.write_pair(str(tmp_path_factory.mktemp("od") / "run"), 8, 100_000, FAULTS)
    names = sorted(os.listdir(env_dir))
    server.filesystem().put([os.path.join(env_dir, n) for n in names], ["%s/run/%s" % (name, n) for n in names])
    return env_dir, trainer, "s3://%s/run" % name, "s3://%s/run/trainer.npz" % name


@pytest.fixture
def on_demand(monkeypatch):
    """ON_DEMAND set for the test, and {URL: bytes fetched} of every copy made."""
    fetched = {}
    real = ondemand.OnDemand.put

    def put(self, start, data):
        fetched[self.url] = fetched.get(self.url, 0) + len(data)
        return real(self, start, data)
    monkeypatch.setattr(ondemand.OnDemand, "put", put)
    token = ON_DEMAND.set(True)
    yield fetched
    ON_DEMAND.reset(token)
    assert not ondemand.COPIES  # every copy released with its ledger


def test_opening_a_runs_ledgers_fetches_their_directories_and_small_members_only(run, on_demand):
    """What reading a directory of env ledgers reads: each file's directory and the members it checks on
    opening (the small ones, and the deflated ones it CRC-checks), and the first events of its stored digest
    columns (for the index hints): not the rest of those, which are most of a ledger."""
    env_dir, trainer, env_url, trainer_url = run
    with read(env_url) as led:
        assert sorted(led.streams) == list(range(8)) and all(len(s) == 100_000 for s in led.streams.values())
    for e in range(8):
        path = os.path.join(env_dir, "env-%d.npz" % e)
        lf = LedgerFile(path)
        stored = [m.csize for m in lf.members.values() if m.method == 0]
        lf.close()
        url, size = "%s/env-%d.npz" % (env_url, e), os.path.getsize(path)
        assert sum(stored) > 0.7 * size  # the digest columns: most of the file
        assert 0 < on_demand[url] <= size - sum(stored) + len(stored) * (128 << 10), (url, on_demand[url], size)
    assert trainer_url not in on_demand


def test_a_compare_from_copies_filled_as_read_is_the_compare_from_whole_copies(run, on_demand):
    env_dir, trainer, env_url, trainer_url = run
    local = compare(env_dir, trainer, count_all=True, jobs=1)
    filled = compare(env_url, trainer_url, count_all=True, jobs=1)
    assert filled.to_json().replace(env_url, env_dir) == local.to_json()
    assert str(filled).replace(env_url, env_dir) == str(local)
    assert [(d.env, d.fields, d.event) for d in filled.differences] == [
        (d.env, d.fields, d.event) for d in local.differences] and len(local.differences) == 3
    # the comparison read every column, so every byte of the files was fetched, once
    for e in range(8):
        assert on_demand["%s/env-%d.npz" % (env_url, e)] <= os.path.getsize(os.path.join(env_dir, "env-%d.npz" % e))


def test_rows_read_fetch_those_rows_and_not_the_rest_of_the_file(run, on_demand, tmp_path):
    env_dir, trainer, env_url, trainer_url = run
    url = trainer_url
    size = os.path.getsize(trainer)
    copy = ondemand.OnDemand(url, str(tmp_path / "t.npz"), size)
    try:
        ondemand.prefetch([copy])
        lf = LedgerFile(copy.local)
        want = LedgerFile(trainer)
        opened = on_demand[url]
        try:
            start = int(lf.offsets[5]) + 1000
            got = lf.source("h_obs").read(start, start + 500)
            assert np.array_equal(got, want.source("h_obs").read(start, start + 500))
        finally:
            lf.close()
            want.close()
        assert on_demand[url] - opened <= 2 * ondemand.GRAIN  # the rows' grains, not the member
    finally:
        copy.release()


def test_an_object_replaced_while_it_is_read_is_one_line_naming_it(bucket, tmp_path, on_demand):
    server, name = bucket
    fs = server.filesystem()
    key = "%s/changing/env-0.npz" % name
    fs.pipe(key, b"x" * 300_000)
    copy = ondemand.OnDemand("s3://" + key, str(tmp_path / "c.npz"), 300_000)
    try:
        copy.ensure(0, 10)
        fs.pipe(key, b"y" * 1000)  # shorter now: the copy would mix two files
        with pytest.raises(LedgerError) as err:
            copy.ensure(200_000, 10)
        assert str(err.value).startswith("s3://%s: changed while it was read" % key) and "\n" not in str(err.value)
        fs.rm(key)
        with pytest.raises(LedgerError, match=r"^s3://%s: removed while it was read$" % key):
            copy.ensure(100_000, 10)
    finally:
        copy.release()


def test_the_ranges_kept_are_what_was_added_whatever_the_order():
    rng = random.Random(7)
    for _ in range(300):
        have, model = [], np.zeros(200, bool)
        for _ in range(rng.randrange(1, 12)):
            a = rng.randrange(0, 199)
            b = rng.randrange(a + 1, 200)
            miss = ondemand._missing(have, a, b)
            assert np.array_equal(np.isin(np.arange(a, b), [i for s, e in miss for i in range(s, e)]), ~model[a:b])
            have = ondemand._merge(have, a, b)
            model[a:b] = True
            assert all(s < e for s, e in have) and all(have[i][1] < have[i + 1][0] for i in range(len(have) - 1))
            covered = np.zeros(200, bool)
            for s, e in have:
                covered[s:e] = True
            assert np.array_equal(covered, model)
