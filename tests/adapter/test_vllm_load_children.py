"""A request's choice of the children that may load it, under vLLM's real Scheduler: its
``kv_transfer_params['multiconnector_load_children']`` (docs/vllm.md, "Which child loads").

Only the children it names are asked to look it up, chosen to load it, or parts of its split
load; naming none of the children holding its tokens recomputes it; a bad value is that
request's alone: it loads from no child, counted once and logged once, and the server goes on.
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import logging  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm_children import Script, child, script  # noqa: E402
from vllm_harness import Engine, make_config, make_request  # noqa: E402

from multiconnector.vllm import LOAD_CHILDREN_KEY, LOOKUP_KEY, ROLE_KEY, SPLIT_KEY  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

PROMPT = 40
LOOKUP = "get_num_new_matched_tokens"
RANGE = "RangeConnector"


def engine(model: Path, *scripts: Script, kind: str = "ScriptedConnector", **extra: Any) -> Engine:
    children = [child(f"c{i}", made, kind) for i, made in enumerate(scripts)]
    return Engine(make_config(model, children, extra=extra))


def add(e: Engine, request_id: str, only: Any = None, max_tokens: int = 2) -> Any:
    request = make_request(request_id, num_tokens=PROMPT, max_tokens=max_tokens)
    if only is not None:
        request.kv_transfer_params = {LOAD_CHILDREN_KEY: only}
    return e.add(request)


def asked(made: Script, request_id: str) -> int:
    return sum(1 for call in made.names(LOOKUP) if call[1] == request_id)


def told(made: Script, request_id: str) -> list[int]:
    return [c[2] for c in made.names("update_state_after_alloc") if c[1] == request_id]


def ranges(made: Script, request_id: str) -> list[tuple[int, int]]:
    return [
        (c[2], c[3]) for c in made.names("update_state_after_alloc_range") if c[1] == request_id
    ]


def finish(e: Engine, *request_ids: str) -> None:
    for _ in range(4):
        e.step()
    assert sorted(e.outputs) == sorted(request_ids)
    assert len(e.connector.tracker) == 0
    assert e.connector._scheduler.lookups.held() == 0  # nothing of the key kept


@pytest.mark.parametrize("policy", ["first", "longest"])
def test_only_the_named_child_is_asked_and_loads(model: Path, policy: str) -> None:
    c0, c1 = script(tokens=16), script(tokens=24)
    e = engine(model, c0, c1, **{LOOKUP_KEY: policy})
    add(e, "r", ["c1"] if policy == "first" else ["c0"])
    e.step()
    loader, other = (c1, c0) if policy == "first" else (c0, c1)
    tokens = 24 if policy == "first" else 16  # without the key: c0 under first, c1 longest
    assert asked(other, "r") == 0 and asked(loader, "r") == 1
    assert e.scheduled[0] == {"r": PROMPT - tokens}
    assert told(loader, "r") == [tokens] and told(other, "r") == [0]
    hits = e.connector.child_hits()
    name = "c0" if other is c0 else "c1"
    assert hits[name]["excluded"] == 1 and "asked" not in hits[name]
    assert len(other.names("request_finished")) == 0
    finish(e, "r")
    # request_finished is still called once on every child (vLLM's contract): saves are the
    # children's own decision.
    assert len(c0.names("request_finished")) == len(c1.names("request_finished")) == 1


def test_a_request_without_the_key_is_looked_up_as_before(model: Path) -> None:
    c0, c1 = script(tokens=16), script(tokens=24)
    e = engine(model, c0, c1)
    add(e, "r")
    e.step()
    assert e.scheduled[0] == {"r": PROMPT - 16} and told(c0, "r") == [16]
    finish(e, "r")


@pytest.mark.parametrize("only", [["c2"], [], ("c2",)], ids=["not-a-holder", "none", "tuple"])
def test_naming_none_of_the_holders_recomputes(model: Path, only: Any) -> None:
    c0, c1, c2 = script(tokens=16), script(tokens=24), script(tokens=0)
    e = engine(model, c0, c1, c2, **{LOOKUP_KEY: "longest"})
    add(e, "r", only)
    e.step()
    assert e.scheduled[0] == {"r": PROMPT}  # every token computed
    assert asked(c0, "r") == asked(c1, "r") == 0
    assert asked(c2, "r") == (1 if only else 0)
    assert e.connector._scheduler.lookups.refusals.count == 0  # a valid choice
    finish(e, "r")


def test_a_split_load_uses_only_the_named_children(model: Path) -> None:
    # c0 holds the first 16 tokens; c1 and c2 hold up to 32 and 24 tokens from the start.
    c0, c1, c2 = script(holds=16), script(holds=32), script(holds=24)
    e = engine(model, c0, c1, c2, kind=RANGE, **{SPLIT_KEY: True})
    add(e, "free")  # another prompt (another id length)
    add(e, "kept_one", ["c0", "c2"])
    e.step()
    assert ranges(c0, "free") == [(0, 16)] and ranges(c1, "free") == [(16, 16)]
    assert ranges(c0, "kept_one") == [(0, 16)] and ranges(c2, "kept_one") == [(16, 8)]
    assert asked(c1, "kept_one") == 0 and ranges(c1, "kept_one") == []
    assert e.scheduled[0] == {"free": PROMPT - 32, "kept_one": PROMPT - 24}
    assert e.connector.tracker.get("kept_one").parts == ("c2",)
    finish(e, "free", "kept_one")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("c0", "must be a list of child names"),  # a str: its characters are no names
        ([0], "must be a list of child names"),
        ({"c0"}, "must be a list of child names"),
        (["c0", "nope"], "names \\['nope'\\], not children that may load"),
        (["c1"], "names \\['c1'\\], not children that may load"),  # save-only
    ],
    ids=["str", "not-str", "set", "unknown", "save-only"],
)
def test_a_bad_key_is_that_requests_alone_counted_and_logged_once(
    model: Path, value: Any, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    c0, c1 = script(tokens=16), script(tokens=16)
    saver = child("c1", c1)
    saver["kv_connector_extra_config"][ROLE_KEY] = "save"
    children = [child("c0", c0), saver]
    e = Engine(make_config(model, children))
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        bad = add(e, "bad", value)
        e.step()
        # vLLM asking again (a lookup of the same request) neither counts nor logs it again.
        assert e.connector.get_num_new_matched_tokens(bad, 0) == (0, False)
        assert e.connector.may_load_async(bad) is False
    assert e.scheduled[0] == {"bad": PROMPT}  # loaded from no child: recomputed
    assert asked(c0, "bad") == 0
    lines = [r.getMessage() for r in caplog.records if LOAD_CHILDREN_KEY in r.getMessage()]
    assert len(lines) == 1
    assert "request 'bad'" in lines[0] and "loads from no child" in lines[0]
    assert re.search(says, lines[0])
    assert e.connector._scheduler.lookups.refusals.count == 1
    hits = e.connector.child_hits()
    assert hits["c0"]["refused"] == 1 and "c1" not in hits  # c1 never loads
    # The server goes on: the next request, without the key, loads as before.
    ok = "ok" + "x" * 5  # another prompt
    add(e, ok)
    e.step()
    assert e.scheduled[-1][ok] == PROMPT - 16 and told(c0, ok) == [16]
    finish(e, "bad", ok)
