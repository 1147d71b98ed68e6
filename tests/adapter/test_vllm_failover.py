"""``load_fallback``: what becomes of a load whose loader raises at allocation, under vLLM's
real ``Scheduler`` with two workers and vLLM's own output aggregator.

``recompute`` (the default, as before): the load is reported failed and vLLM recomputes its
tokens. ``failover``: the next child that offers the tokens (loading as the loader would) loads
them, told once, as vLLM tells a connector; only when none does is the load reported failed.
Either way every request finishes and nothing outlives it (docs/vllm.md, "When a child fails").
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm_children import Script, child, script  # noqa: E402
from vllm_harness import BLOCK, Workers  # noqa: E402

from bench.scheduler_parts import make_request  # noqa: E402
from multiconnector import InvalidArgumentError, InvalidValueError  # noqa: E402
from multiconnector.vllm import FALLBACK_KEY, LOAD_CHILDREN_KEY, LOOKUP_KEY  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

PROMPT = 56
HELD = 3 * BLOCK
FAILOVER = {FALLBACK_KEY: "failover"}
PROMPT_TOKENS = [(7 * i) % 900 + 10 for i in range(PROMPT)]


def told(made: Script, request_id: str = "r") -> list[int]:
    """The external tokens each update_state_after_alloc told ``made``'s child."""
    return [call[2] for call in made.names("update_state_after_alloc") if call[1] == request_id]


def serve(w: Workers, made_async: list[Script], *, params: dict[str, Any] | None = None) -> None:
    """``r`` to its end; an asynchronous load is reported done by each worker of the child
    told it (of ``made_async``) in the step after it was told."""
    w.engine.add(make_request("r", PROMPT_TOKENS, max_tokens=2, kv_transfer_params=params))
    reported: set[tuple[str, int]] = set()

    def report(rank: int) -> None:
        for made in made_async:
            if any(told(made)) and (made.label, rank) not in reported:
                reported.add((made.label, rank))
                made.recving.add("r")

    for _ in range(30):
        w.step(before_worker=report)
        if "r" in w.outputs:
            return
    raise AssertionError("r was not served")


@pytest.mark.parametrize("load_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("fallback", ["recompute", "failover"])
def test_a_loader_that_raises_at_allocation(model: Path, load_async: bool, fallback: str) -> None:
    a = script(tokens=HELD, load_async=load_async)
    b = script(tokens=HELD, load_async=load_async)
    a.raise_in["update_state_after_alloc"] = RuntimeError("store down")
    children = [child("a", a), child("b", b)]
    w = Workers(model, 2, children, tokens_per_step=256, **{FALLBACK_KEY: fallback})
    serve(w, [b])
    connector = w.engine.connector
    first, *later = told(a)
    assert first == HELD and not any(later)  # told its tokens once, raised; never again
    # It raises at every allocation (an asynchronous load's request is allocated again).
    assert connector.child_failures() == {"a": {"update_state_after_alloc": 1 + len(later)}}
    if fallback == "failover":
        assert told(b)[0] == HELD  # b loads a's tokens, in the same step
        assert w.computed_for("r") == PROMPT - HELD + 1  # the prompt's rest, then one decode
        assert not any(w.invalid_to_vllm)
        assert connector.child_hits()["b"]["chosen"] == 1
    else:
        assert not any(told(b))  # no child loads it again: recomputed
        # Within the step, the prompt's rest ran before its load errors came back; an
        # asynchronous load failed before anything ran.
        assert w.computed_for("r") == (PROMPT + 1 if load_async else PROMPT - HELD + PROMPT + 1)
    assert len(connector.tracker) == 0
    assert connector._scheduler.lookups.held() == 0


@pytest.mark.parametrize(
    ("b_answers", "b_async", "loads"),
    [
        (HELD + 4, False, True),  # more than a's: b loads a's tokens (those vLLM granted)
        (HELD - BLOCK, False, False),  # fewer: not a stand-in
        (HELD, True, False),  # loads asynchronously where a loaded within the step
        (0, False, False),
    ],
    ids=["more", "fewer", "other-mode", "none"],
)
def test_only_a_child_offering_the_tokens_the_same_way_stands_in(
    model: Path, b_answers: int, b_async: bool, loads: bool
) -> None:
    a, b = script(tokens=HELD), script(tokens=b_answers, load_async=b_async)
    a.raise_in["update_state_after_alloc"] = RuntimeError("store down")
    w = Workers(
        model, 2, [child("a", a), child("b", b)], tokens_per_step=256, **{FALLBACK_KEY: "failover"}
    )
    serve(w, [])
    assert told(b) == ([HELD] if loads else [0])
    assert w.computed_for("r") == PROMPT - HELD + (1 if loads else PROMPT + 1)
    assert len(w.engine.connector.tracker) == 0


def test_the_next_stand_in_is_tried_when_one_raises_too(model: Path) -> None:
    a, b, c = script(tokens=HELD), script(tokens=HELD), script(tokens=HELD)
    a.raise_in["update_state_after_alloc"] = RuntimeError("store down")
    b.raise_in["update_state_after_alloc"] = RuntimeError("also down")
    children = [child("a", a), child("b", b), child("c", c)]
    w = Workers(model, 2, children, tokens_per_step=256, **{FALLBACK_KEY: "failover"})
    serve(w, [])
    assert (told(a), told(b), told(c)) == ([HELD], [HELD], [HELD])
    assert w.computed_for("r") == PROMPT - HELD + 1
    assert w.engine.connector.tracker.get("r") is None


def test_every_stand_in_raising_reports_the_load_failed(model: Path) -> None:
    a, b = script(tokens=HELD), script(tokens=HELD)
    for made in (a, b):
        made.raise_in["update_state_after_alloc"] = RuntimeError("down")
    w = Workers(
        model, 2, [child("a", a), child("b", b)], tokens_per_step=256, **{FALLBACK_KEY: "failover"}
    )
    serve(w, [])
    assert w.computed_for("r") == PROMPT - HELD + PROMPT + 1  # recomputed from its load errors
    assert any(w.invalid_to_vllm)
    assert w.engine.connector.child_failures() == {
        "a": {"update_state_after_alloc": 1},
        "b": {"update_state_after_alloc": 1},
    }


def test_a_child_the_requests_params_leave_out_does_not_stand_in(model: Path) -> None:
    a, b, c = script(tokens=HELD), script(tokens=HELD), script(tokens=HELD)
    a.raise_in["update_state_after_alloc"] = RuntimeError("store down")
    children = [child("a", a), child("b", b), child("c", c)]
    w = Workers(
        model, 2, children, tokens_per_step=256, **{FALLBACK_KEY: "failover", LOOKUP_KEY: "longest"}
    )
    serve(w, [], params={LOAD_CHILDREN_KEY: ["a", "c"]})
    assert told(b) == [0] and told(c) == [HELD]
    assert not [call for call in b.names("get_num_new_matched_tokens") if call[1] == "r"]


@pytest.mark.parametrize(
    ("value", "error"),
    [("retry", InvalidValueError), (True, InvalidArgumentError), (None, InvalidArgumentError)],
)
def test_a_bad_fallback_is_refused_before_any_child_starts(
    model: Path, value: Any, error: type[Exception]
) -> None:
    made = script()
    with pytest.raises(error, match=rf"kv_connector_extra_config\['{FALLBACK_KEY}'\]"):
        Workers(model, 2, [child("a", made)], **{FALLBACK_KEY: value})
    assert made.instances == []
