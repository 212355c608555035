"""What every library's adapter does the same way, so that each adapter only translates its library.

An adapter is a wrapper of the library's own kind (a Gymnasium ``Wrapper`` or ``VectorWrapper``, an SB3
``VecEnvWrapper``, a PettingZoo parallel wrapper) with one of these bases first among its bases, as
Gymnasium's ``VectorWrapper`` carries what every vector wrapper needs:

- ``EnvAdapter``, on the env side: the adapter records into a ``Recording`` (``self._recording``, None
  until it has an index or where no file is written). It gives ``ledger_path``, ``flush`` and ``close``
  (the ledger, then the wrapped env).
- ``TrainerAdapter``, on the trainer side: the adapter drives a ``TrainerLedger`` (``self.ledger``,
  built by ``self._open_ledger``). It gives ``ledger_path``, ``live_faults``, ``set_on_fault``, ``flush``
  and ``close`` (the ledger, then the wrapped vector env).

Both mark the ledger interrupted when an exception escapes the wrapped env: ``self._call(fn, ...)``
calls it so, and ``self._interrupted()`` is what a ``try``/``except BaseException`` written in place
calls. What runs within a vector step (an adapter's ``step``, and an env-side ``reset``, which a vector
env's autoreset calls from its step) writes that ``try`` in place: since Python 3.11 a ``try`` costs
nothing until something is raised, and a call through ``_call`` costs one Python call (about 330
instructions, benchmarks/overhead.py --instructions). The trainer side's resets, once a run, use
``_call``.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from stepledger.recording.live import BoundaryFault
from stepledger.recording.recording import Recording
from stepledger.recording.trainer import TrainerLedger

__all__ = ["EnvAdapter", "TrainerAdapter"]

T = TypeVar("T")


class _Adapter:
    """Marking the ledger interrupted: an exception escaped a call into the wrapped env."""

    def _interrupted(self) -> None:
        raise NotImplementedError

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, a call into the wrapped env: if it raises (an error, a Ctrl-C), the run
        did not end cleanly, and the ledger says so."""
        try:
            return fn(*args, **kwargs)
        except BaseException:
            self._interrupted()
            raise


class EnvAdapter(_Adapter):
    """The env side's plumbing: ``ledger_path``, ``flush``, ``close`` and the interrupted mark of the
    ``Recording`` in ``self._recording`` (None until the adapter has an index, or with no file).

    First among the adapter's bases, before the library's wrapper class, whose ``close`` closes the
    wrapped env.
    """

    _recording: Recording | None = None

    @property
    def ledger_path(self) -> str | None:
        """Where the ledger is written (None until there is a recording: no index yet, or no file)."""
        recording = self._recording
        return None if recording is None else recording.path

    def _interrupted(self) -> None:
        """An exception escaped the env's step or reset: the run did not end cleanly."""
        if self._recording is not None:
            self._recording.interrupted = True

    def _closing(self) -> None:
        """Called by ``close`` just before the recording is closed (its path claimed); a hook."""

    def flush(self) -> None:
        """Write what is new in the ledger now (a spill segment, at a cost proportional to what is new);
        recording goes on. ``read()`` and ``compare`` find it; ``close()`` writes the final file."""
        recording = self._recording
        if recording is not None:
            recording.claim()  # first: a second live writer of this index records beside it
            recording.flush()

    def close(self) -> None:
        """Write the ledger file, then close the wrapped env."""
        try:
            recording = self._recording
            if recording is not None:
                recording.claim()
                self._closing()
                recording.close()
        finally:
            super().close()  # type: ignore[misc]  # the library's wrapper class, after this one


class TrainerAdapter(_Adapter):
    """The trainer side's plumbing: ``ledger_path``, ``live_faults``, ``set_on_fault``, ``flush``,
    ``close`` and the interrupted mark of the ``TrainerLedger`` in ``self.ledger``, which the adapter
    builds with ``_open_ledger`` (what it records from, and where it looked for final observations).
    """

    ledger: TrainerLedger
    live: bool
    _wrapped: Any

    def _open_ledger(self, wrapped: Any, path: Any, num_envs: int, observation_space: Any, action_space: Any,
                     **options: Any) -> TrainerLedger:
        """Build ``self.ledger`` (``TrainerLedger(path, num_envs, observation_space, action_space,
        **options)``) for the vector env ``wrapped``, which ``close`` closes after the ledger."""
        self._wrapped = wrapped
        self.ledger = ledger = TrainerLedger(path, num_envs, observation_space, action_space, **options)
        self.live = ledger.live
        return ledger

    @property
    def ledger_path(self) -> str | None:
        """Where the trainer ledger is written (None in live-only mode)."""
        return self.ledger.path

    @property
    def live_faults(self) -> list[BoundaryFault]:
        """The boundary faults the live check has found so far (BoundaryFault objects)."""
        return self.ledger.live_faults

    def live_metrics(self) -> dict[str, int]:
        """The live check's counts so far, by their metric names (TrainerLedger.live_metrics)."""
        return self.ledger.live_metrics()

    def set_on_fault(self, on_fault: Any) -> None:
        """Change what a live mismatch does ("raise", "warn", "record" or a callable)."""
        self.ledger.set_on_fault(on_fault)

    def _interrupted(self) -> None:
        """An exception escaped the vector env's step or reset: the run did not end cleanly."""
        self.ledger.interrupted()

    def flush(self) -> None:
        """Write what is new in the trainer ledger; recording goes on."""
        self.ledger.flush()

    def close(self, **kwargs: Any) -> None:
        """Write the trainer ledger, then close the vector env (``kwargs`` go to its ``close``)."""
        try:
            self.ledger.close()
        finally:
            self._wrapped.close(**kwargs)
