"""The checker's seam: what :mod:`multiconnector.check` does to an aggregator beyond its public
calls, in one place, outside the aggregator.

* ``request_finished`` and ``match_tokens`` in their two halves, each an event of its own, so
  that any other event can come between them, as it can between two threads:
  :func:`ask` and :func:`answer` run ``request_finished``'s (``_claim`` and ``_gather``: claim
  and ask every ready connector; ``_apply_answers``: tell the core, under the request's lock),
  and :func:`match_ask` and :func:`match_answer` ``match_tokens``' (``_ask_match`` and
  ``_record_match``). The public calls are exactly those steps in sequence (tests/test_races.py
  checks the halves apply as one call would): the checker runs the aggregator's own code, with
  no hook of its own in it.
* :func:`held`, :func:`queued` and :func:`counted`: the books the checker's properties read,
  read without taking them (``take()`` would be an event) and without the stripes' locks (the
  checker runs one event at a time).

A world is copied with ``copy.deepcopy(mc, memo)``, the aggregator's own copy
(:meth:`~multiconnector.aggregator._books.Books.__deepcopy__`, :mod:`.fork`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..aggregator import MultiConnector
from ..aggregator.saving import Asked
from ..health import ChildHealth
from ..healthbook import HealthBook
from ..machine import RequestTransferState
from ..outcome import Outcome
from ..registry import Entry

__all__ = [
    "answer",
    "ask",
    "counted",
    "held",
    "match_answer",
    "match_ask",
    "queued",
    "savers_asked",
]

_APPLIED = Outcome.applied


def ask(mc: MultiConnector, request_id: str, blocks: Sequence[int]) -> Asked | tuple[Outcome, None]:
    """request_finished's first half: claim the request and ask every ready connector.
    Returns ``(outcome, None)`` when refused (nobody asked), else what :func:`answer` takes,
    the claim among it: held until :func:`answer` drops it."""
    claimed = mc._claim(request_id)
    if not isinstance(claimed, tuple):
        return (claimed, None)
    record, claim, index = claimed
    try:
        ready = mc.registry.ready_entries()
        savers, failures, merged, clash = mc._gather(ready, request_id, blocks)
    except BaseException:
        mc._release(record, claim, index)
        raise
    return record, claim, index, ready, savers, failures, merged, clash


def savers_asked(asked: Asked) -> list[Entry]:
    """The connectors that answered :func:`ask` that they save (garbage answers included)."""
    return asked[4]


def answer(mc: MultiConnector, asked: Asked) -> tuple[Outcome, dict[str, Any] | None]:
    """request_finished's second half: tell the core what :func:`ask` gathered."""
    return mc._apply_answers(*asked)


def match_ask(mc: MultiConnector, request_id: str) -> tuple[Any, ...]:
    """match_tokens' first half: mark the request and ask every ready connector. Returns
    ``(result,)`` when nobody was asked (the request is not pending), else what
    :func:`match_answer` takes; the mark is held until :func:`match_answer` drops it."""
    asked = mc._ask_match(request_id)
    return (asked,) if asked.__class__ is int else asked  # type: ignore[return-value]


def match_answer(mc: MultiConnector, matched: tuple[Any, ...]) -> int | None:
    """match_tokens' second half: tell the core the loader :func:`match_ask`'s answers chose."""
    return mc._record_match(*matched)


def held(mc: MultiConnector) -> Mapping[str, RequestTransferState]:
    """The records held, by request id (read, never written)."""
    return mc._requests


def queued(mc: MultiConnector) -> Sequence[RequestTransferState]:
    """What ``take()`` would hand back now, in order, without taking it."""
    return mc._done


def counted(mc: MultiConnector) -> dict[tuple[Outcome, str | None], int]:
    """What ``counts()`` and ``connector_counts()`` sum (by outcome; by name), in one read,
    without the stripes' locks: the same sums, in a fifth of the time with the checker's one
    stripe."""
    total = mc._counts[0].copy()
    for index, stripe in enumerate(mc._counts):
        if index:
            for key, n in stripe.items():
                total[key] = total.get(key, 0) + n
        for name, n in mc._applied[index].items():
            key = (_APPLIED, name)
            total[key] = total.get(key, 0) + n
        if mc._finishes[index]:
            key = (_APPLIED, None)
            total[key] = total.get(key, 0) + mc._finishes[index]
    return total


def health_records(book: HealthBook) -> dict[str, ChildHealth]:
    """A health book's records, by name (read, never written: :mod:`.fork` copies them)."""
    return book._records


def set_health_records(book: HealthBook, records: dict[str, ChildHealth]) -> None:
    """Give a copied book its own records (:mod:`.fork`)."""
    book._records = records
    book._unreported = {}
