"""Progress on stderr, for the command line's long jobs, and only when stderr is a terminal.

A CI log or a redirected stderr gets nothing: progress lines there are noise.
The library's functions take an optional ``progress`` callable; the command
line passes a ``Progress``.
"""

import sys
import time


class Progress:
    """``progress(done, total)`` rewrites one status line on stderr, at most a few times a second.

    Silent unless the stream is a terminal. ``done()`` clears the line.

    :param label: what is being counted, e.g. ``"compare: envs"``.
    :param stream: where to write (default: ``sys.stderr``).
    :param interval: the least time between two updates, in seconds.
    """

    def __init__(self, label, stream=None, interval=0.2):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        try:
            self.active = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.active = False
        self._last = 0.0
        self._shown = False

    def __call__(self, done, total):
        if not self.active:
            return
        now = time.monotonic()
        if now - self._last < self.interval and done < total:
            return
        self._last = now
        self.stream.write("\r%s %d of %d" % (self.label, done, total))
        self.stream.flush()
        self._shown = True

    def done(self):
        if self.active and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False
