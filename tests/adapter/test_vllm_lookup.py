"""The lookup policy under vLLM's real Scheduler: which child's hit loads a request.

``first`` (the default) is vLLM's rule; ``longest`` loads from the child with the most tokens; a
``None`` ("ask me again") holds a request unless a child asked before already covers it, and
under ``longest`` a child gets ``lookup_patience_steps`` of them per request (docs/vllm.md,
"Which child loads").
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm_children import Script, child, script  # noqa: E402
from vllm_harness import Engine, make_config, make_request  # noqa: E402

from multiconnector import InvalidArgumentError, InvalidValueError  # noqa: E402
from multiconnector.vllm import LOOKUP_KEY, PATIENCE_KEY  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

PROMPT = 40


def engine(model: Path, *scripts: Script, ours: bool = True, **extra: Any) -> Engine:
    children = [child(f"c{i}", made) for i, made in enumerate(scripts)]
    return Engine(make_config(model, children, ours=ours, extra=extra or None))


def told(made: Script, request_id: str) -> list[int]:
    """The external tokens each update_state_after_alloc told ``made``'s child."""
    return [call[2] for call in made.names("update_state_after_alloc") if call[1] == request_id]


@pytest.mark.parametrize("ours", [True, False], ids=["ours", "vllm"])
def test_first_is_the_default_and_agrees_with_vllm(model: Path, ours: bool) -> None:
    short, long = script(tokens=16), script(tokens=32)
    e = engine(model, short, long, ours=ours)
    e.add(make_request("r", num_tokens=PROMPT, max_tokens=2))
    e.step()
    assert e.scheduled[0] == {"r": PROMPT - 16}
    assert told(short, "r") == [16] and told(long, "r") == [0]


def test_longest_loads_from_the_child_with_the_most(model: Path) -> None:
    short, long, none = script(tokens=16), script(tokens=32), script(tokens=0)
    e = engine(model, short, long, none, **{LOOKUP_KEY: "longest"})
    e.add(make_request("r", num_tokens=PROMPT, max_tokens=2))
    e.step()
    assert e.scheduled[0] == {"r": PROMPT - 32}
    assert e.connector.tracker.get("r").loader == "c1"
    # Every loser gets its blocks and 0 external tokens, exactly once.
    assert told(short, "r") == [0] and told(long, "r") == [32] and told(none, "r") == [0]
    for _ in range(3):
        e.step()
    assert "r" in e.outputs


def test_longest_ties_go_to_the_first_configured(model: Path) -> None:
    a, b = script(tokens=32), script(tokens=32)
    e = engine(model, a, b, **{LOOKUP_KEY: "longest"})
    e.add(make_request("r", num_tokens=PROMPT, max_tokens=1))
    e.step()
    assert told(a, "r") == [32] and told(b, "r") == [0]


def test_a_none_after_a_child_covering_the_prompt_does_not_hold_it(model: Path) -> None:
    """``PROMPT - 1`` tokens cover all the scheduler lets a connector load (vLLM computes the
    last prompt token itself)."""
    covers, looking = script(tokens=PROMPT - 1), script(tokens=None)
    e = engine(model, covers, looking)
    e.add(make_request("r", num_tokens=PROMPT, max_tokens=1))
    e.step()
    assert e.scheduled[0] == {"r": 1}
    assert told(covers, "r") == [PROMPT - 1]


@pytest.mark.parametrize("ours", [True, False], ids=["ours", "vllm"])
def test_a_none_after_a_shorter_hit_holds_the_request_as_in_vllm(model: Path, ours: bool) -> None:
    short, looking = script(tokens=16), script(tokens=None)
    e = engine(model, short, looking, ours=ours)
    e.add(make_request("r", num_tokens=PROMPT, max_tokens=1))
    for _ in range(3):
        e.step()
    assert all("r" not in scheduled for scheduled in e.scheduled)


def test_longest_gives_a_child_looking_up_forever_its_patience_then_goes_on(model: Path) -> None:
    hit, forever = script(tokens=16), script(tokens=None)
    e = engine(model, hit, forever, **{LOOKUP_KEY: "longest", PATIENCE_KEY: 3})
    e.add(make_request("r", num_tokens=PROMPT, max_tokens=1))
    steps = 0
    while not any("r" in scheduled for scheduled in e.scheduled):
        e.step()
        steps += 1
        assert steps <= 5, "held past the patience"
    asked = [call for call in forever.names("get_num_new_matched_tokens") if call[1] == "r"]
    assert len(asked) == 4  # three None answers waited for, the fourth one given up on
    assert told(hit, "r") == [16]
    assert e.connector.child_failures() == {"c1": {"get_num_new_matched_tokens": 1}}
    e.step()
    assert "r" in e.outputs
    assert e.connector._scheduler.lookups.held() == 0  # nothing outlives it


def test_a_child_answering_before_its_patience_runs_out_is_waited_for(model: Path) -> None:
    short, slow = script(tokens=16), script(tokens=None)
    e = engine(model, short, slow, **{LOOKUP_KEY: "longest", PATIENCE_KEY: 5})
    e.add(make_request("r", num_tokens=PROMPT, max_tokens=1))
    e.step()
    e.step()
    assert all("r" not in scheduled for scheduled in e.scheduled)  # held while c1 looks up
    slow.tokens = 32
    e.step()
    assert e.scheduled[-1] == {"r": PROMPT - 32}
    assert told(slow, "r") == [32] and told(short, "r") == [0]
    assert e.connector.child_failures() == {}


@pytest.mark.parametrize(
    ("extra", "error", "key"),
    [
        ({LOOKUP_KEY: "last"}, InvalidArgumentError, LOOKUP_KEY),
        ({LOOKUP_KEY: 1}, InvalidArgumentError, LOOKUP_KEY),
        ({PATIENCE_KEY: 0}, InvalidValueError, PATIENCE_KEY),
        ({PATIENCE_KEY: "3"}, InvalidArgumentError, PATIENCE_KEY),
    ],
)
def test_a_bad_policy_is_refused_before_any_child_starts(
    model: Path, extra: dict[str, Any], error: type[Exception], key: str
) -> None:
    made = script()
    with pytest.raises(error, match=rf"kv_connector_extra_config\['{key}'\]"):
        engine(model, made, **extra)
    assert made.instances == []
