"""A real browser for the tests of the HTML report: headless Chromium (Debian's ``chromium`` package).

``dump_dom(page)`` loads a file in headless Chromium and returns the DOM once the page's scripts have run,
parsed into a small tree (``Node``) to query by tag, id and class. ``screenshot(page, png)`` renders it to a PNG.
Each call uses a profile directory of its own, so that runs in parallel (or another user's Chromium) do not
share one. ``CHROMIUM`` is None where no Chromium is installed; the tests skip with ``SKIP_REASON``.
"""

import html.parser
import os
import shutil
import subprocess
import tempfile

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
SKIP_REASON = "no Chromium on this machine (apt-get install chromium; .ci/run installs it)"
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
          "--disable-extensions", "--disable-background-networking", "--hide-scrollbars"]


def _run(args, timeout):
    with tempfile.TemporaryDirectory(prefix="stepledger-chromium-") as profile:
        return subprocess.run([CHROMIUM, *_FLAGS, "--user-data-dir=%s" % profile, *args], capture_output=True,
                              text=True, timeout=timeout)


def _url(page):
    return "file://" + os.path.abspath(os.fspath(page))


def dump_dom(page, timeout=120):
    """The DOM of ``page`` after its scripts ran, as a Node tree."""
    out = _run(["--dump-dom", _url(page)], timeout)
    assert out.returncode == 0 and "<html" in out.stdout, out.stderr[-2000:]
    return parse(out.stdout)


def screenshot(page, png, width=1280, height=900, timeout=120):
    out = _run(["--screenshot=%s" % os.path.abspath(png), "--window-size=%d,%d" % (width, height), _url(page)], timeout)
    assert out.returncode == 0 and os.path.getsize(png) > 0, out.stderr[-2000:]


class Node:
    def __init__(self, tag, attrs, parent=None):
        self.tag, self.attrs, self.parent, self.children = tag, dict(attrs), parent, []

    @property
    def classes(self):
        return (self.attrs.get("class") or "").split()

    def text(self):
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def walk(self):
        for c in self.children:
            if isinstance(c, Node):
                yield c
                yield from c.walk()

    def find_all(self, tag=None, cls=None, **attrs):
        return [n for n in self.walk() if (tag is None or n.tag == tag) and (cls is None or cls in n.classes)
                and all(n.attrs.get(k) == v for k, v in attrs.items())]

    def by_id(self, ident):
        found = self.find_all(id=ident)
        assert len(found) == 1, "%d elements with id %r" % (len(found), ident)
        return found[0]


_VOID = {"meta", "link", "br", "img", "input", "hr", "col", "area", "base", "embed", "source", "track", "wbr"}


class _Parser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.node = Node("#document", {})

    def handle_starttag(self, tag, attrs):
        n = Node(tag, attrs, self.node)
        self.node.children.append(n)
        if tag not in _VOID:
            self.node = n

    def handle_endtag(self, tag):
        n = self.node
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.node = n.parent

    def handle_data(self, data):
        self.node.children.append(data)


def parse(text):
    p = _Parser()
    p.feed(text)
    p.close()
    return p.root
