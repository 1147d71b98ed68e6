"""Which connector loads a request: the lookup policy, :class:`Lookup`, and its two rules.

``match_tokens`` asks each connector that may load, in registration order, how many tokens it
can load (``get_num_new_matched_tokens``). The policy says which answer wins and when a
connector still looking up (``None``, "ask me again") holds the lookup:

* :attr:`Lookup.first`, vLLM's rule and the default: the first connector with more than 0
  tokens loads; the first ``None`` ends the asking and holds the request, unless a connector
  asked before it already covers every token the request has left (then no later answer could
  change the choice, and the ``None`` is not waited for).
* :attr:`Lookup.longest`: every connector is asked; the one with the most tokens loads (ties go
  to the first in registration order); a ``None`` holds the request unless the best answer
  covers every token left.

:func:`wins` and :func:`settled` are the two decisions, written once; :func:`choose` applies
them to answers as they come, and is the one lookup loop: the aggregator's ``match_tokens``
feeds it its connectors' answers, and the vLLM adapter its children's, each asking lazily so
that ``first`` asks no further than vLLM does.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final, TypeVar

from ._validate import shown
from .errors import InvalidArgumentError

__all__ = ["Lookup", "choose", "lookup_of", "settled", "wins"]

_K = TypeVar("_K")


class Lookup(enum.Enum):
    """The lookup policy of a composition: which connector's hit loads a request.

    .. versionadded:: 0.1.0
    """

    #: The first connector, in registration order, with more than 0 tokens (vLLM's rule).
    first = "first"
    #: The connector with the most tokens; ties to the first in registration order.
    longest = "longest"


_FIRST: Final = Lookup.first


def lookup_of(value: object, what: str = "lookup") -> Lookup:
    """``value`` as a :class:`Lookup` (a member or its name); else an
    :class:`~multiconnector.InvalidArgumentError` naming ``what``."""
    if isinstance(value, Lookup):
        return value
    if isinstance(value, str):
        try:
            return Lookup(value)
        except ValueError:
            pass
    names = ", ".join(repr(member.value) for member in Lookup)
    raise InvalidArgumentError(f"{what}={shown(value)} must be a Lookup or one of {names}")


def wins(policy: Lookup, tokens: int, best: int, chosen: bool) -> bool:
    """Whether an answer of ``tokens`` (an int >= 0) takes the load from the best so far
    (``best`` tokens; ``chosen``: whether a connector was chosen yet)."""
    if policy is _FIRST:
        return tokens > 0 and not chosen
    return tokens > best


def settled(best: int, remaining: int | None) -> bool:
    """Whether a ``None`` answer no longer holds the lookup: the best answer so far covers every
    token the request has left (``remaining``; ``None``: not known, then it never does)."""
    return remaining is not None and best > 0 and best >= remaining


def choose(
    policy: Lookup, answers: Iterable[tuple[_K, int | None]], remaining: int | None
) -> tuple[_K | None, int, bool]:
    """Which of ``answers`` loads: ``(key, tokens, held)``, where ``key`` is the winner's
    (``None``: nobody has tokens) and ``held`` whether a ``None`` answer holds the lookup.

    ``answers`` yields ``(key, tokens)`` in registration order, ``tokens`` an int >= 0 or
    ``None`` ("not known yet"); it is read lazily, so a generator that asks as it yields asks
    only the connectors the policy needs. A ``None`` once the best answer settles the lookup
    (:func:`settled`, against ``remaining``) changes nothing. Otherwise, under ``first`` it
    ends the reading and holds the lookup (vLLM's asking ends there); under ``longest`` every
    answer is read, and the lookup is held unless the best answer settles it.
    """
    key: _K | None = None
    best = 0
    held = False
    for candidate, tokens in answers:
        if tokens is None:
            if settled(best, remaining):
                continue  # the choice is made whatever it answers later
            if policy is _FIRST:
                return key, best, True  # read no further, as vLLM asks no further
            held = True
            continue
        if wins(policy, tokens, best, key is not None):
            key, best = candidate, tokens
    return key, best, held and not settled(best, remaining)
