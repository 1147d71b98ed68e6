"""Which child loads each request, as the scheduler asks them: :class:`Lookups`.

vLLM asks the scheduler's connector ``get_num_new_matched_tokens`` for each request it would
schedule, again each step while the answer is ``None`` ("still looking up"). :class:`Lookups`
asks the children that may load (not the save-only ones), checks each answer (what cannot be
true is that child's failure, counted as no hit), and feeds them lazily to the one lookup rule,
:func:`~multiconnector.lookup.choose`, so that under ``first`` no child is asked past vLLM's
point. It keeps, per request, only what later lookups need: whether the chosen loader loads
asynchronously, the children whose load of it failed (not asked again), and under ``longest``
the ``None`` answers in a row per child (past the patience, :data:`GAVE_UP`: the lookup goes
on without that child, a :class:`~multiconnector.vllm.LookupPatienceError` counted once).

With a health machine (``kv_connector_extra_config['health']``), a child it holds open is not
asked (as if it answered 0; counted ``skipped``), a half-open one's answers are probes, and an
answer slower than ``slow_lookup_seconds`` is taken and counted its failure
(:class:`~multiconnector.vllm.SlowLookupError`).

A request whose ``kv_transfer_params`` name the children that may load it
(:data:`~multiconnector.vllm.choice.LOAD_CHILDREN_KEY`, read at its first lookup) is looked up,
loaded and split across those only; the others count ``excluded`` (as if they answered 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from numbers import Integral
from typing import Any, Final

from .._validate import shown
from ..errors import InvalidArgumentError, InvalidValueError, MultiConnectorError
from ..healthbook import HealthBook
from ..lookup import Lookup, choose
from ..registry import Role
from ..rule import slow_lookup
from .children import Children
from .choice import Refusals, load_children
from .config import PATIENCE_KEY, Settings
from .errors import LookupPatienceError, SlowLookupError
from .hits import Hits

__all__ = ["GAVE_UP", "RANGE_HOOK", "Lookups"]

#: In a request's waits: the child answered ``None`` past its patience (not asked again).
GAVE_UP: Final = -1
_SAVE: Final = Role.save
_NONE: Final[frozenset[str]] = frozenset()

#: The method by which a child declares that it loads token ranges, so a load may be split
#: across it and others (``split_loads``): ``update_state_after_alloc_range(request, blocks,
#: start, num_tokens)``, called instead of ``update_state_after_alloc`` when it loads the
#: tokens ``[start, start + num_tokens)`` of a split load. Such a child is also asked
#: ``get_num_new_matched_tokens(request, start)`` with ``start`` past the request's computed
#: tokens, and answers the tokens it holds from ``start`` on.
RANGE_HOOK: Final = "update_state_after_alloc_range"


class Lookups:
    """The scheduler's lookups: each request's children asked, and what later ones need."""

    __slots__ = (
        "_failed_by",
        "_failover",
        "_hits",
        "_kids",
        "_load_async",
        "_loader_names",
        "_only",
        "_patience",
        "_policy",
        "_ranged",
        "_waits",
        "refusals",
    )

    def __init__(self, children: Children, settings: Settings, hits: Hits) -> None:
        self._kids = children
        self._policy = settings.lookup
        self._patience = settings.patience
        self._hits = hits
        #: ``load_fallback: failover``: a request whose load failed may load from another child.
        self._failover = settings.failover
        #: The requests whose chosen loader loads asynchronously.
        self._load_async: set[str] = set()
        #: Per request, the children whose load of it failed.
        self._failed_by: dict[str, set[str]] = {}
        #: Per request, per child, its ``None`` answers in a row (:data:`GAVE_UP` past them).
        self._waits: dict[str, dict[str, int]] = {}
        #: Per request whose params restrict its loaders, the children that may load it
        #: (empty: none, its key was refused).
        self._only: dict[str, frozenset[str]] = {}
        self._loader_names = frozenset(name for name, _ in children.loaders)
        #: The requests whose key naming their loaders was refused.
        self.refusals = Refusals()
        #: The children a load may be split across (``split_loads``), in configuration order:
        #: those that may load and load token ranges (:data:`RANGE_HOOK`).
        self._ranged: tuple[str, ...] = (
            tuple(
                name
                for name, child in children.loaders
                if callable(getattr(child, RANGE_HOOK, None))
            )
            if settings.split
            else ()
        )

    def match(self, request: Any, num_computed_tokens: int) -> tuple[str | None, int, bool]:
        """``(loader, tokens, held)``: the child chosen to load ``request`` (``None``: none has
        tokens) and its count, or whether a ``None`` answer holds the lookup.

        As in vLLM's: a child answering ``None`` holds the lookup, and under ``first`` the
        children after it are not asked; unless a child asked before it already covers every
        token the request has left but its last (which vLLM computes to sample the next token
        from: its prefix cache's hits stop there too). A child that raises or answers what
        cannot be true (a negative count, more tokens than the request has left, ...) counts
        as no hit; the others' answers stand. A request whose load failed loads from no child
        again (vLLM recomputes it), unless the composition fails over (``load_fallback``):
        then every child but those whose load of it failed is asked.
        """
        total = getattr(request, "num_tokens", None)  # an int on vLLM's Request
        remaining = (
            total - num_computed_tokens - 1
            if total.__class__ is int and 0 <= num_computed_tokens < total
            else None
        )
        if not self._failover and self._failed_by and request.request_id in self._failed_by:
            self._load_async.discard(request.request_id)  # its load failed: recomputed
            return None, 0, False
        flags: dict[str, bool] = {}
        failures: list[tuple[str, Exception]] = []
        loader, tokens, held = choose(
            self._policy, self._answers(request, num_computed_tokens, flags, failures), remaining
        )
        if failures:
            self._kids.absorb("get_num_new_matched_tokens", failures, "counted as no hit")
        if loader is not None and not held and flags[loader]:
            self._load_async.add(request.request_id)
        else:
            self._load_async.discard(request.request_id)
        return loader, tokens, held

    def further(self, request: Any, start: int, loader: str) -> tuple[tuple[str, int, int], ...]:
        """The further parts of a split load of ``request`` whose ``loader`` holds its tokens
        up to ``start``: ``(name, start, tokens)`` each, in token order; empty when the load
        is not split (splits are off, ``loader`` loads no ranges, or no other child holds the
        tokens from ``start`` on).

        Each further part is the child that holds the most tokens from where the parts so far
        end (ties in configuration order), among the children that load ranges, load as the
        loader does (both asynchronously, or both not) and were not asked for this load yet.
        A ``None`` answer is no hit here (the request is not held for it); a failure is that
        child's, counted as no hit. A child that reports on fewer workers than all is never a
        part, nor is a load it was chosen for split (its load's completion is counted across
        workers, as one).
        """
        ranged = self._ranged
        if loader not in ranged or len(ranged) < 2:
            return ()
        counted = self._kids.counted()
        if loader in counted:
            return ()
        request_id = request.request_id
        load_async = request_id in self._load_async
        failed_here = self._failed_by.get(request_id, ()) if self._failed_by else ()
        waits = self._waits.get(request_id, {}) if self._waits else {}
        bypassed = self._bypassed()
        only = self.only(request)
        left = [
            name
            for name in ranged
            if name != loader
            and name not in counted
            and name not in failed_here
            and waits.get(name) != GAVE_UP
            and name not in bypassed
            and (only is None or name in only)
        ]
        parts: list[tuple[str, int, int]] = []
        failures: list[tuple[str, Exception]] = []
        while left:
            best: tuple[str, int] | None = None
            for name in left:
                answer = self._again(name, self._kids.by_name[name], request, start, failures)
                if answer is None:
                    continue
                tokens, flag = answer
                if tokens and flag is load_async and (best is None or tokens > best[1]):
                    best = (name, tokens)
            if best is None:
                break
            parts.append((best[0], start, best[1]))
            start += best[1]
            left = [name for name in left if name != best[0] and name not in dict(failures)]
        if failures:
            self._kids.absorb("get_num_new_matched_tokens", failures, "counted as no hit")
        return tuple(parts)

    def stand_in(self, request: Any, start: int, tokens: int, tried: set[str]) -> str | None:
        """The child that loads ``request``'s ``tokens`` from ``start`` in place of a loader
        that raised at allocation (``load_fallback: failover``): the first, in configuration
        order, that may load it now (not tried, not failed for it, not open, not left out by
        its params) and answers at least ``tokens``, loading as the loader would (both
        asynchronously, or both not: vLLM already decided the request's wait). ``None``: no
        child does. Each is asked ``get_num_new_matched_tokens`` as at a lookup (counted
        ``asked``; a failure is its own, counted as no hit); a child that answers more than
        ``tokens`` loads ``tokens``, as when vLLM trims a hit to whole blocks."""
        request_id = request.request_id
        load_async = request_id in self._load_async
        failed_here = self._failed_by.get(request_id, ()) if self._failed_by else ()
        waits = self._waits.get(request_id, {}) if self._waits else {}
        failures: list[tuple[str, Exception]] = []
        found = None
        for name, child in self.askable(request):
            if name in tried or name in failed_here or waits.get(name) == GAVE_UP:
                continue
            answer = self._again(name, child, request, start, failures)
            if answer is not None and (answer[0] or 0) >= tokens and answer[1] is load_async:
                found = name
                break
        if failures:
            self._kids.absorb("get_num_new_matched_tokens", failures, "counted as no hit")
        return found

    def _again(
        self, name: str, child: Any, request: Any, start: int, failures: list[tuple[str, Exception]]
    ) -> tuple[int | None, bool] | None:
        """Child ``name`` asked about ``request`` from ``start`` past its lookup (a split
        load's further part, a stand-in): counted ``asked`` (and its hit), watched by the
        health machine if any; ``None`` when it failed (in ``failures``). A ``None`` answer
        counts against no patience."""
        self._hits.add(name, "asked")
        health = self._kids.health
        try:
            answer = (
                self._asked(name, child, request, start, waits=False)
                if health is None
                else self._probed(health, name, child, request, start, waits=False)
            )
        except Exception as exc:
            failures.append((name, exc))
            return None
        if answer[0]:
            self._hits.answered(name, answer[0])
        return answer

    def loads_async(self, request_id: str) -> bool:
        """Whether the loader last chosen for ``request_id`` loads asynchronously."""
        return request_id in self._load_async

    def failed(self, name: str, request_id: str) -> None:
        """Child ``name``'s load of ``request_id`` failed: it is not asked again for it (vLLM
        reschedules the request, which would otherwise fail the same way)."""
        self._failed_by.setdefault(request_id, set()).add(name)

    def forget(self, request_id: str) -> None:
        """``request_id`` finished: nothing of its lookups is kept."""
        self._load_async.discard(request_id)
        if self._failed_by:
            self._failed_by.pop(request_id, None)
        if self._waits:
            self._waits.pop(request_id, None)
        if self._only:
            self._only.pop(request_id, None)

    def held(self) -> int:
        """How many requests something of their lookups is kept for."""
        return len(
            self._load_async | self._failed_by.keys() | self._waits.keys() | self._only.keys()
        )

    def only(self, request: Any) -> frozenset[str] | None:
        """The children ``request``'s params let load it (``None``: every one): its
        :data:`~multiconnector.vllm.choice.LOAD_CHILDREN_KEY`, read once per request. A bad
        value is that request's: refused (counted ``refused`` per loader, logged), and no
        child loads it."""
        request_id = request.request_id
        found = self._only.get(request_id) if self._only else None
        if found is not None:
            return found
        try:
            only = load_children(request, self._loader_names)
        except MultiConnectorError as exc:
            self.refusals.refuse(exc)
            for name in self._loader_names:
                self._hits.add(name, "refused")
            only = _NONE
        if only is not None:
            self._only[request_id] = only
        return only

    def askable(self, request: Any) -> tuple[tuple[str, Any], ...]:
        """The ``(name, child)`` pairs that may load ``request`` and are asked about it now
        (``may_load_async``): not open (health), and named by its params when they name any."""
        pairs = self._kids.loaders
        bypassed = self._bypassed()
        if bypassed:  # open: not asked to look up, nor this
            pairs = tuple(pair for pair in pairs if pair[0] not in bypassed)
        only = self.only(request)
        if only is not None:
            pairs = tuple(pair for pair in pairs if pair[0] in only)
        return pairs

    def _bypassed(self) -> frozenset[str]:
        """The children held open by their health machine now (none without one): not asked
        to look up, nor to load. The one health gate of the lookups; read it once per call."""
        health = self._kids.health
        return _NONE if health is None else health.bypassed

    def _answers(
        self,
        request: Any,
        num_computed_tokens: int,
        flags: dict[str, bool],
        failures: list[tuple[str, Exception]],
    ) -> Iterator[tuple[str, int | None]]:
        """Each child that may load, asked when read, with its token count (its load flag in
        ``flags``); under ``first`` no child after a ``None`` is asked (as in vLLM's). A
        failure is that child's, in ``failures``, not an answer."""
        request_id = request.request_id
        first = self._policy is Lookup.first
        failed_here = self._failed_by.get(request_id, ()) if self._failed_by else ()
        waits = self._waits.get(request_id) if self._waits else None
        health = self._kids.health
        bypassed = self._bypassed()
        only = self.only(request)
        for name, child in self._kids.items:
            if self._kids.roles[name] is _SAVE:
                continue  # never looked up
            if name in failed_here or (waits is not None and waits.get(name) == GAVE_UP):
                yield name, 0
                continue
            if only is not None and name not in only:  # the request's params leave it out
                self._hits.add(name, "excluded")
                yield name, 0
                continue
            if name in bypassed:  # its health machine is open: as if it answered 0
                self._hits.add(name, "skipped")
                yield name, 0
                continue
            self._hits.add(name, "asked")
            try:
                if health is None:
                    tokens, load_async = self._asked(name, child, request, num_computed_tokens)
                else:
                    tokens, load_async = self._probed(
                        health, name, child, request, num_computed_tokens
                    )
            except Exception as exc:
                failures.append((name, exc))
                continue
            if tokens is None:
                yield name, None
                if first:
                    return
                continue
            if tokens:  # most often none: nothing to count
                self._hits.answered(name, tokens)
            flags[name] = load_async
            yield name, tokens

    def _probed(
        self,
        health: HealthBook,
        name: str,
        child: Any,
        request: Any,
        num_computed_tokens: int,
        *,
        waits: bool = True,
    ) -> tuple[int | None, bool]:
        """:meth:`_asked`, watched by the children's health machine: an answer slower than
        ``slow_lookup_seconds`` is taken and is the child's failure
        (:func:`~multiconnector.rule.slow_lookup`, a :class:`SlowLookupError`); a number
        answered in time by a half-open child is a probe's success, and under
        ``failure_rate`` (:attr:`~multiconnector.healthbook.HealthBook.rated`) a closed
        child's is a call in its window (told only then: the hot path pays nothing else)."""
        bound = health.settings.slow_lookup_seconds
        began = health.clock() if bound is not None else 0.0
        tokens, load_async = self._asked(name, child, request, num_computed_tokens, waits=waits)
        if bound is not None:
            took = health.clock() - began
            if slow_lookup(took, bound):
                slow = SlowLookupError(
                    f"child {name!r} took {took:.3g} s to answer a lookup of request "
                    f"{request.request_id!r} (slow_lookup_seconds={bound:g})"
                )
                self._kids.absorb("get_num_new_matched_tokens", [(name, slow)], "its answer taken")
                return tokens, load_async
        if tokens is not None and (health.rated or name in health.probing):
            health.answered(name)
        return tokens, load_async

    def _asked(
        self, name: str, child: Any, request: Any, num_computed_tokens: int, *, waits: bool = True
    ) -> tuple[int | None, bool]:
        """Child ``name``'s answer, checked: ``(tokens, load_async)``; what cannot be true
        raises (the caller counts it as that child's failure). ``waits``: a ``None`` answer
        counts against the child's patience (under ``longest``)."""
        answer = child.get_num_new_matched_tokens(request, num_computed_tokens)
        if answer.__class__ is not tuple or len(answer) != 2:
            raise InvalidArgumentError(
                f"child {name!r} answered get_num_new_matched_tokens with {shown(answer)}; "
                "must be a (tokens, load_async) pair"
            )
        tokens, load_async = answer
        request_id = request.request_id
        if tokens is None:
            if waits and self._policy is Lookup.longest:
                self._wait(name, request_id)
            return None, False
        if self._waits and request_id in self._waits:
            self._waits[request_id].pop(name, None)
        if tokens.__class__ is not int:
            if isinstance(tokens, bool) or not isinstance(tokens, Integral):
                raise InvalidArgumentError(
                    f"child {name!r} answered tokens={shown(tokens)}; must be an int or None"
                )
            tokens = int(tokens)
        if tokens < 0:
            raise InvalidValueError(f"child {name!r} answered tokens={tokens}; must be >= 0")
        if tokens == 0:
            return 0, False
        total = getattr(request, "num_tokens", None)  # an int on vLLM's Request
        if total.__class__ is int and tokens > total - num_computed_tokens:
            raise InvalidValueError(
                f"child {name!r} answered tokens={tokens} for a request with "
                f"{total - num_computed_tokens} token(s) left to compute"
            )
        if load_async is not True and load_async is not False:
            raise InvalidArgumentError(
                f"child {name!r} answered load_async={shown(load_async)}; must be a bool"
            )
        if not load_async and total.__class__ is int and tokens >= total - num_computed_tokens:
            # vLLM's scheduler asserts it has a token to compute in the step of such a load
            # (an asynchronous one's last token is recomputed once it arrived).
            raise InvalidValueError(
                f"child {name!r} answered tokens={tokens}, to load within the step, for a "
                f"request with {total - num_computed_tokens} token(s) left to compute: such a "
                "load must leave one to compute"
            )
        return tokens, load_async

    def _wait(self, name: str, request_id: str) -> None:
        """One more ``None`` answer of child ``name`` for ``request_id``; past the patience in
        a row, a :class:`LookupPatienceError` (the child's failure: no hit) and no more
        asking it for that request."""
        waits = self._waits.setdefault(request_id, {})
        waited = waits.get(name, 0) + 1
        patience = self._patience
        if waited <= patience:
            waits[name] = waited
            return
        waits[name] = GAVE_UP
        raise LookupPatienceError(
            f"child {name!r} answered None (still looking up) for request {request_id!r} "
            f"{patience} times in a row: the lookup goes on without it for this request "
            f"(kv_connector_extra_config[{PATIENCE_KEY!r}])"
        )
