"""The load side: which connector loads a pending request's KV, and its report.

:meth:`~MultiConnector.match_tokens` chooses the loader by name;
:meth:`~MultiConnector.load_finished` applies its report, or the drain of a terminal request's
load.
"""

from __future__ import annotations

from .._validate import bad_argument, check_int, check_name, check_request_id, shown
from ..errors import ConnectorFailures, UnknownRequestError
from ..machine import TERMINAL
from ..outcome import Outcome
from ..registry import Entry
from ._books import (
    _APPLIED,
    _DRAINED,
    _DUPLICATE,
    _PENDING,
    _TERMINAL,
    _UNKNOWN_REQUEST,
    _UNREGISTERED,
    Books,
)

__all__ = ["Loading"]


class Loading(Books):
    """``match_tokens`` and ``load_finished``: the loader chosen, its report applied."""

    __slots__ = ()

    def match_tokens(self, request_id: str, num_computed_tokens: int = 0) -> int | None:
        """How many tokens can be loaded for a pending request, choosing the loader by name.

        Ready connectors that have ``get_num_new_matched_tokens`` are asked in registration
        order. The first that answers ``None`` ("not known yet") ends the asking, as in vLLM:
        the answer is ``None``, the rest are not asked, and nothing is remembered. Otherwise the
        first connector with more than 0 tokens is remembered as the request's ``loader`` and its
        count returned; 0 means nothing to load. A connector that raises counts as 0 and
        :class:`ConnectorFailures` is raised after the others were asked.

        Raises :class:`UnknownRequestError` for a request that is not held; returns 0 for one
        that is no longer pending.
        """
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        if num_computed_tokens.__class__ is not int or num_computed_tokens < 0:
            num_computed_tokens = check_int(num_computed_tokens, "num_computed_tokens")
        if self._closed:
            self._shut("match_tokens")
        record = self._requests.get(request_id)
        if record is None:
            raise UnknownRequestError(f"request_id={request_id!r} is not held")
        if record.state is not _PENDING:
            return 0
        unknown = False
        chosen: tuple[str, int] | None = None
        chooser: Entry | None = None
        errors: list[Exception] = []
        failed: list[str] = []
        for entry in self._registry._ready:  # what ready_entries() returns, without the call
            if entry.get_num_new_matched_tokens is None:
                continue
            try:
                tokens = entry.get_num_new_matched_tokens(request_id, num_computed_tokens)
                if tokens is not None and (type(tokens) is not int or tokens < 0):
                    raise bad_argument(type(tokens) is int)(
                        f"connector {entry.name!r} answered tokens={shown(tokens)}; "
                        "must be an int >= 0 or None"
                    )
            except Exception as exc:
                errors.append(exc)
                failed.append(entry.name)
                continue
            if tokens is None:
                unknown = True
                break  # "not known yet": vLLM asks no further
            if tokens > 0 and chosen is None:
                chosen, chooser = (entry.name, tokens), entry
        result: int | None
        if unknown:
            result = None
        else:
            index = hash(request_id) & self._mask
            with self._locks[index]:
                if record.state is _PENDING:
                    record.loader = chosen[0] if chosen else None
                    record.loaded = False
                    # Unregistered while we asked: its load report can never be applied.
                    record.loader_gone = (
                        chosen is not None and self._registry.entry(chosen[0]) is not chooser
                    )
            result = chosen[1] if chosen else 0
        if errors:
            raise ConnectorFailures(
                f"{len(errors)} connector(s) failed to answer for request {request_id!r}",
                errors,
                failed=failed,
                result=result,
            )
        return result

    def load_finished(self, request_id: str, name: str) -> Outcome:
        """Connector ``name`` reports that it finished loading ``request_id``'s KV.

        Applied once, from the chosen loader, while the request is live; the connector's
        ``on_load_finished(request_id)`` is then called, and the record's ``loaded`` is true
        from then on (on a terminal request the report is its drain, ``drained``, and sets it
        too). A duplicate, late, or phantom load
        report is ignored like any other: from the chosen loader unregistered since it was
        chosen (even when a new connector took its name) it is ``unregistered``, from a
        connector never chosen ``phantom``. When ``on_load_finished`` raises,
        :class:`ConnectorFailures` carries the outcome applied as its ``result``.
        """
        name = check_name(name)
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        if self._closed:
            self._shut("load_finished")
        index = hash(request_id) & self._mask
        lock = self._locks[index]
        lock.acquire()
        try:
            record = self._requests.get(request_id)
            if record is None:
                outcome = _UNKNOWN_REQUEST
            elif record.state in TERMINAL:
                if record.loader == name and not (record.loaded or record.loader_gone):
                    # the drain of its load
                    record.loaded = True
                    outcome = _DRAINED
                    self._settle(record)
                else:
                    outcome = _TERMINAL
            elif record.loader == name:
                if record.loader_gone:  # unregistered while the match asked it
                    outcome = _UNREGISTERED
                elif not record.loaded:
                    outcome = _APPLIED
                    record.loaded = True
                elif name in record.abandoned:  # its load ended when it was unregistered
                    outcome = _UNREGISTERED
                else:
                    outcome = _DUPLICATE
            else:
                outcome = self._stranger(name)
            self._count(index, outcome, name)
        finally:
            lock.release()
        if outcome is not _APPLIED:
            self._log_ignored("load_finished", request_id, name, outcome)
            return outcome
        entry = self._registry.entry(name)
        if entry is not None and entry.on_load_finished is not None:
            self._call_back(outcome, entry, entry.on_load_finished, request_id)
        return outcome
