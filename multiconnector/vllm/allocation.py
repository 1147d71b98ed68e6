"""An allocation told to every child, each once: :func:`tell_allocation`.

vLLM calls the scheduler's connector ``update_state_after_alloc(request, blocks, tokens)`` once
per request it allocates blocks for. The loader is told its ``tokens``, every other child 0
and the blocks. The loader is told first: when it raises and the composition fails over
(``load_fallback: failover``), the next child that offers the tokens is told them instead,
before the rest are told 0, so that each child is told exactly once, as vLLM tells a
connector.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .children import Children, Failures, failed

__all__ = ["external_blocks", "tell_allocation"]


def tell_allocation(
    children: Children,
    request: Any,
    blocks: Any,
    loader: str | None,
    tokens: int,
    *,
    stand_in: Callable[[set[str]], str | None] | None = None,
) -> tuple[str | None, Failures]:
    """Tell every child of ``request``'s allocation; ``(the child that loads, failures)``.

    ``loader`` (``None``: nobody loads) is told ``tokens``. When it raises, ``stand_in`` (if
    given) names the next child to try, given the children tried so far (``None``: no more);
    the first that takes the tokens loads them. The child that loads is ``None`` when nobody
    was to load or every one tried raised. Every other child is told 0. The failures (each
    ``(name, exception)``) are the caller's to absorb.
    """
    failures: Failures = None
    tried: set[str] = set()
    loads = None
    candidate = loader
    while candidate is not None:
        tried.add(candidate)
        try:
            children.by_name[candidate].update_state_after_alloc(request, blocks, tokens)
        except Exception as exc:
            failures = failed(failures, candidate, exc)
            candidate = stand_in(tried) if stand_in is not None else None
            continue
        loads = candidate
        break
    for name, child in children.items:
        if name in tried:
            continue
        try:
            child.update_state_after_alloc(request, blocks, 0)
        except Exception as exc:
            failures = failed(failures, name, exc)
    return loads, failures


def external_blocks(blocks: Any, block_size: int, matched_at: int, tokens: int) -> tuple[int, ...]:
    """The ids of the blocks that hold a request's ``tokens`` external tokens, after the
    ``matched_at`` it had computed (one KV cache group; none for more: vLLM recomputes load
    errors by block only with one group)."""
    try:
        groups = blocks.get_block_ids()
    except Exception:  # not vLLM's KVCacheBlocks: nothing to name
        return ()
    if len(groups) != 1:
        return ()
    return tuple(groups[0][matched_at // block_size : -(-(matched_at + tokens) // block_size)])
