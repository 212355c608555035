"""compare --html: the page of a report, rendered in a real browser (headless Chromium) and read through its DOM."""

import functools
import os
import re
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest

import browser
from hostile_ledgers import record_pair
from stepledger import LedgerEnv, LedgerVectorEnv, compare, wording
from stepledger.cli.main import main
from stepledger.faults import FaultyEnv
from stepledger.format import schema as S
from stepledger.format.spaces import LeafLayout
from stepledger.recording.recording import Recording
from stepledger.report import html as H
from stepledger.report.compare import SPREAD_BINS

needs_chromium = pytest.mark.skipif(browser.CHROMIUM is None, reason=browser.SKIP_REASON)

# env -> (fault, from which step counter, dose): one-off faults and two that recur
FAULTS = {1: ("reward:f16", 12, "one"), 3: ("obs:f16", 40, "one"), 4: ("truncated:as-term", 0, "one"),
          6: ("reward:zero", 60, 0.3)}
N_ENVS = 8


def _make(i, directory, keep_values):
    env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=25), directory, index=i, keep_values=keep_values)
    if i in FAULTS:
        fault, at, dose = FAULTS[i]
        env = FaultyEnv(env, fault, index=i, at=at, target=i, dose=dose)
    return env


def pendulum_run(directory, keep_values=True, steps=150):
    """A real run: Pendulum in a SyncVectorEnv, a fault between the two sides of four envs of eight."""
    directory = str(directory)
    trainer = os.path.join(directory, "trainer.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(
            [functools.partial(_make, i, directory, keep_values) for i in range(N_ENVS)]), trainer,
            keep_values=keep_values)
        envs.single_action_space.seed(0)
        envs.reset(seed=0)
        for _ in range(steps):
            envs.step(np.stack([envs.single_action_space.sample() for _ in range(N_ENVS)]))
        envs.close()
    return directory, trainer


BOX = gym.spaces.Box(-1, 1, (3,), np.float32)
ACT = gym.spaces.Box(-2, 2, (1,), np.float32)


def open_streams(path, side, streams, extra_meta=None):
    """A ledger being written, of explicit events: streams maps stream -> [(kind, h_obs, h_act, reward, te, tr)].
    ``close()`` writes it."""
    from stepledger import core
    rec = Recording(path, side, sorted(streams), LeafLayout(BOX), LeafLayout(ACT), np.float32, False, extra_meta)
    for k, s in enumerate(sorted(streams)):
        for kind, ho, ha, r, te, tr in streams[s]:
            rec.buffers[k].append(kind, ho, ha, core.reward_bits(r, True), te, tr)
    return rec


def write_streams(path, side, streams, extra_meta=None):
    open_streams(path, side, streams, extra_meta).close()
    return path


def episode(n_steps, start=100, reward=-1.0):
    events = [(S.KIND_RESET, start, 0, 0.0, False, False)]
    events += [(S.KIND_STEP, start + k, 7, reward, False, k == n_steps) for k in range(1, n_steps + 1)]
    return events


def spoiled(events, at, every=0, field=3, value=5.0):
    """``events`` with field ``field`` (3: reward) changed at event ``at`` and, with ``every``, each ``every`` on."""
    out = [list(e) for e in events]
    for k in range(at, len(out), every or len(out)):
        out[k][field] = value if field == 3 else out[k][field] + 1
    return [tuple(e) for e in out]


def page_of(tmp_path, *args):
    page = str(tmp_path / "report.html")
    code = main(["compare", *args, "--html", page])
    return code, page


def self_contained(text):
    """No network, nothing from outside the page: no URL, no external script, style, font or image."""
    assert not re.search(r"(?i)\b(https?|ftp)://|//[a-z0-9.-]+\.[a-z]{2,}/", text)
    assert not re.search(r"(?i)<(link|img|iframe|object|embed)\b", text)
    assert not re.search(r"(?i)<script[^>]*\bsrc=|@import|url\(", text)


# ---------------------------------------------------------------- without a browser

def test_spread_counts_every_later_difference_in_its_part_of_the_stream(tmp_path):
    env = {0: episode(999)}  # 1,000 events
    d = tmp_path / "ledger"
    d.mkdir()
    write_streams(str(d / "env-0.npz"), "env", env)
    write_streams(str(d / "trainer.npz"), "trainer", {0: spoiled(env[0], 500, every=10)})
    (diff,) = compare(str(d), str(d / "trainer.npz"), count_all=True).differences
    assert diff.event == 500 and diff.counts["reward"] == 50
    spread = diff.spread["reward"]
    assert len(spread) == SPREAD_BINS and sum(spread) == 50
    assert spread[:50] == [0] * 50 and spread[50:] == [1] * 50  # 10 events a part, one of them differing
    assert compare(str(d), str(d / "trainer.npz")).differences[0].spread == {}  # without --all: none


def test_page_is_self_contained_and_escapes_what_ledgers_bring(tmp_path):
    evil = '<img src=x onerror="alert(1)"></script><script>alert(2)</script>&amp;'
    d = tmp_path / "ledger"
    d.mkdir()
    agents = [evil, "agent_1"]
    env = {0: episode(5), 1: episode(5)}
    write_streams(str(d / "env-0.npz"), "env", env, {S.META_POSSIBLE_AGENTS: agents})
    write_streams(str(d / "trainer.npz"), "trainer", {0: spoiled(env[0], 3), 1: env[1]})
    report = compare(str(d), str(d / "trainer.npz"))
    assert report.agent_streams and evil in str(report)
    text = H.to_html(report, title=evil)
    self_contained(text)
    assert evil not in text and "<img" not in text and text.count("<script>") == 1
    assert H.html.escape(evil, quote=True) in text


def test_exit_2_writes_a_page_with_the_error(tmp_path, capsys):
    code, page = page_of(tmp_path, str(tmp_path / "nowhere"), str(tmp_path / "trainer.npz"))
    assert code == 2
    err = capsys.readouterr().err.strip()
    text = open(page, encoding="utf-8").read()
    self_contained(text)
    assert H.html.escape(err[len("stepledger: "):], quote=False) in text


# ---------------------------------------------------------------- in Chromium

def _rows(dom):
    return dom.by_id("streams").find_all("tbody")[0].find_all("tr")


@needs_chromium
def test_a_real_run_with_faults_in_chromium(tmp_path, capsys):
    d, t = pendulum_run(tmp_path / "ledger")
    code, page = page_of(tmp_path, d, t, "--all")
    assert code == 1
    report = compare(d, t, count_all=True)
    assert [x.env for x in report.differences] == sorted(FAULTS)
    text = open(page, encoding="utf-8").read()
    self_contained(text)
    assert text == H.to_html(report, "stepledger compare %s %s" % (d, t))  # the command writes the API's page
    dom = browser.dump_dom(page)
    # the summary first: the verdict is the report's count line
    assert dom.by_id("verdict").text() == wording.envs_differ(len(FAULTS), N_ENVS)
    assert "differ" in dom.by_id("verdict").classes
    # one row per env, in order; the script ran: every row shown (few streams), and it says so
    rows = _rows(dom)
    assert [r.attrs["id"] for r in rows] == ["s-%d" % e for e in range(N_ENVS)]
    assert [e for e, r in enumerate(rows) if r.attrs["class"] == "d"] == sorted(FAULTS)
    assert not any("hidden" in r.attrs for r in rows)
    assert dom.by_id("shown").text() == "%d of %d streams shown" % (N_ENVS, N_ENVS)
    for diff in report.differences:
        row = dom.by_id("s-%d" % diff.env)
        link = row.find_all("a")[0]
        assert link.attrs["href"] == "#d-%d" % diff.env
        detail = dom.by_id("d-%d" % diff.env)
        # the row's detail: its report line (linked to the line in the text report) and both sides' values
        line = detail.find_all("div", cls="line")[0]
        assert line.text() == diff.line()
        assert line.find_all("a")[0].attrs["href"] == "#l-%d" % diff.env
        assert dom.by_id("l-%d" % diff.env).text() == diff.line()
        cells = {tr.find_all("th")[0].text(): [td.text() for td in tr.find_all("td")]
                 for tr in detail.find_all("table")[0].find_all("tbody")[0].find_all("tr")}
        assert set(cells) == set(diff.fields)
        for f in diff.fields:
            assert cells[f][:2] == [diff.env_values[f], diff.trainer_values[f]]
        # the mark where the streams part ways, at its place along the run
        mark = row.find_all("span", cls="mark")[0]
        left = float(re.search(r"left:([\d.]+)%", mark.attrs["style"]).group(1))
        assert abs(left - 100.0 * diff.event / max(diff.env_events, diff.trainer_events)) < 0.01
        assert H.COLOURS[diff.fields[0]] in mark.attrs["style"]
        # with --all, a strip per differing field
        strips = row.find_all("div", cls="spread")
        assert [s.attrs["data-field"] for s in strips] == [f for f in S.FIELDS if diff.counts.get(f)]
    recurring = dom.by_id("s-6").find_all("div", cls="spread")[0].attrs["style"]
    assert recurring.count(H.COLOURS["reward"]) > 3  # a fault that recurs: several runs of parts
    # the text report, whole, at the end
    assert [li.text() for li in dom.by_id("report").find_all("li")] == report.lines()
    assert not dom.find_all("script", src=None)[0].attrs  # one inline script, nothing loaded
    # a screenshot renders
    browser.screenshot(page, str(tmp_path / "report.png"))


@needs_chromium
def test_a_clean_run_and_the_values_hint(tmp_path):
    d, t = record_pair(tmp_path / "clean")
    code, page = page_of(tmp_path, d, t)
    assert code == 0
    dom = browser.dump_dom(page)
    assert dom.by_id("verdict").text() == wording.envs_differ(0, 2) and "ok" in dom.by_id("verdict").classes
    assert not dom.find_all(cls="detail") and all(r.attrs["class"] == "a" for r in _rows(dom))
    d2, t2 = record_pair(tmp_path / "faulty", fault="obs:stale")  # digests only: the values hint
    code, page = page_of(tmp_path, d2, t2)
    assert code == 1
    dom = browser.dump_dom(page)
    assert wording.VALUES_HINT in [li.text() for li in dom.by_id("hints").find_all("li")]


@needs_chromium
def test_multi_agent_grid_of_env_copies_by_agents(tmp_path):
    agents = ["pursuer_0", "pursuer_1", "evader"]
    d = tmp_path / "ledger"
    d.mkdir()
    n_copies, trainer = 4, {}
    for c in range(n_copies):
        env = {c * 3 + k: episode(6, start=10 * c + k) for k in range(3)}
        write_streams(str(d / ("env-%d.npz" % c)), "env", env, {S.META_POSSIBLE_AGENTS: agents})
        trainer.update(env)
    trainer[2 * 3 + 1] = spoiled(trainer[2 * 3 + 1], 4)  # env copy 2, agent pursuer_1
    trainer[3 * 3 + 2] = spoiled(trainer[3 * 3 + 2], 2, field=1)  # env copy 3, evader: obs
    write_streams(str(d / "trainer.npz"), "trainer", trainer)
    code, page = page_of(tmp_path, str(d), str(d / "trainer.npz"))
    assert code == 1
    dom = browser.dump_dom(page)
    assert dom.by_id("verdict").text() == wording.envs_differ(2, 12, agent_streams=True)
    grid = dom.by_id("grid")
    assert [th.text() for th in grid.find_all("thead")[0].find_all("th")] == ["env copy"] + agents
    body = grid.find_all("tbody")[0].find_all("tr")
    assert [r.find_all("th")[0].text() for r in body] == [str(c) for c in range(n_copies)]
    links = [[a.attrs["href"] for a in r.find_all("a")] for r in body]
    assert links[2][1] == "#d-7" and links[3][2] == "#d-11" and links[0] == ["#s-0", "#s-1", "#s-2"]
    assert H.COLOURS["reward"] in body[2].find_all("a")[1].attrs["style"]
    assert H.COLOURS["obs"] in body[3].find_all("a")[2].attrs["style"]
    assert dom.by_id("s-7").find_all("td")[0].text() == "env 2, agent pursuer_1"


@needs_chromium
def test_hostile_agent_names_and_file_names_stay_text_in_the_browser(tmp_path):
    evil = '<img src=x onerror="document.title=1">"\'><u id=inj>x</u></script><script>document.title=2</script>'
    d = tmp_path / "ledger"
    d.mkdir()
    env = {0: episode(5), 1: episode(5)}
    write_streams(str(d / "env-0.npz"), "env", env, {S.META_POSSIBLE_AGENTS: [evil, "a<i>"]})
    trainer = str(d / "trainer<u>.npz")
    write_streams(trainer, "trainer", {0: spoiled(env[0], 3), 1: env[1]})
    code, page = page_of(tmp_path, str(d), trainer)
    assert code == 1
    dom = browser.dump_dom(page)
    assert not dom.find_all("img") and not dom.find_all("u") and not dom.find_all(id="inj")
    assert len(dom.find_all("script")) == 1
    assert not any(k.startswith("on") for n in dom.walk() for k in n.attrs)
    assert dom.find_all("title")[0].text().startswith("stepledger compare")
    assert evil in dom.by_id("l-0").text() and "trainer<u>.npz" in dom.by_id("d-0").text()


@needs_chromium
def test_a_thousand_streams_stay_small_and_readable(tmp_path):
    n, differ = 1000, 300
    d = tmp_path / "ledger"
    d.mkdir()
    events = {e: episode(199, start=e * 1000) for e in range(n)}
    trainer = open_streams(str(d / "trainer.npz"), "trainer", {  # begun first: the env ledgers are of its run
        e: spoiled(events[e], 20 + e % 150, every=7) if e % 10 < 3 else events[e] for e in range(n)})
    for e in range(n):
        write_streams(str(d / ("env-%d.npz" % e)), "env", {e: events[e]})
    trainer.close()
    code, page = page_of(tmp_path, str(d), str(d / "trainer.npz"), "--all")
    assert code == 1
    size = os.path.getsize(page)
    assert size < 1_500_000, size  # a few hundred bytes a stream, not an image each
    t0 = time.monotonic()
    dom = browser.dump_dom(page, timeout=180)
    rendered = time.monotonic() - t0
    rows = _rows(dom)
    assert len(rows) == n and sum(r.attrs["class"] == "d" for r in rows) == differ
    # many streams: the page opens with only those that differ shown
    assert dom.by_id("only").attrs.get("checked") is not None
    assert sum("hidden" not in r.attrs for r in rows) == differ
    assert dom.by_id("shown").text() == "%d of %d streams shown" % (differ, n)
    assert len(dom.find_all(cls="detail")) == differ and not dom.find_all("svg")
    print("1,000 streams, 300 differ, --all: %d bytes, rendered in %.1f s" % (size, rendered))


def test_the_example_writes_the_page_of_its_faults(tmp_path):
    import subprocess
    import sys
    import testpaths
    page = str(tmp_path / "report.html")
    proc = subprocess.run([sys.executable, os.path.join(testpaths.ROOT, "examples", "html_report.py"), page],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "7 of 16 envs differ" in proc.stdout
    text = open(page, encoding="utf-8").read()
    self_contained(text)
    assert '<p class="verdict differ" id="verdict">7 of 16 envs differ</p>' in text
    assert text.count('class="spread"') >= 8  # --all: a strip per differing field
