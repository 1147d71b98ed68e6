"""Roles per child under vLLM's real Scheduler: ``multiconnector_role`` in a child's own
``kv_connector_extra_config`` (docs/vllm.md, "Roles").

A save-only child is never asked ``get_num_new_matched_tokens`` and never told to load; a
load-only child is never awaited for a save; both still get ``request_finished`` once per request
and every other lifecycle hook.
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import logging  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm_children import Script, child, script  # noqa: E402
from vllm_harness import Engine, make_config, make_connector, make_request  # noqa: E402

from multiconnector import InvalidArgumentError, InvalidValueError, Role  # noqa: E402
from multiconnector.vllm import ROLE_KEY  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

PROMPT = 40


def with_role(name: str, made: Script, role: str | None) -> dict[str, Any]:
    entry = child(name, made)
    if role is not None:
        entry["kv_connector_extra_config"][ROLE_KEY] = role
    return entry


def told(made: Script, request_id: str) -> list[int]:
    return [call[2] for call in made.names("update_state_after_alloc") if call[1] == request_id]


def finished(made: Script, request_id: str) -> int:
    return sum(1 for call in made.names("request_finished") if call[1] == request_id)


def run_one(engine: Engine, request_id: str, *savers: Script) -> None:
    """Run ``request_id`` until it finished, then have each of ``savers`` report its save."""
    engine.add(make_request(request_id, num_tokens=PROMPT, max_tokens=2))
    for _ in range(6):
        engine.step()
        if request_id in engine.outputs:
            break
    for made in savers:
        made.sending.add(request_id)
    engine.step()
    engine.step()


def test_a_save_only_child_is_never_looked_up_nor_told_to_load(model: Path) -> None:
    store, disk = script(tokens=32, saves=True), script(tokens=16)
    engine = Engine(
        make_config(model, [with_role("store", store, "save"), with_role("disk", disk, None)])
    )
    assert engine.connector._kids.roles == {"store": Role.save, "disk": Role.both}
    engine.add(make_request("r", num_tokens=PROMPT, max_tokens=2))
    for _ in range(4):
        engine.step()
    assert "r" in engine.outputs and engine.held("r")  # its save is awaited
    store.sending.add("r")
    engine.step()
    assert store.names("get_num_new_matched_tokens") == []
    assert told(store, "r") == [0] and told(disk, "r") == [16]  # its blocks, 0 tokens
    assert finished(store, "r") == 1 and finished(disk, "r") == 1
    assert "r" in engine.outputs and not engine.held("r")


def test_a_load_only_child_is_never_awaited_for_a_save(model: Path) -> None:
    pd, saver = script(tokens=0, saves=True), script(saves=True)
    engine = Engine(
        make_config(model, [with_role("pd", pd, "load"), with_role("disk", saver, "both")])
    )
    run_one(engine, "r", saver)
    # The load-only child promised a save: its failure, not awaited; the other saver's
    # report alone frees the request.
    assert finished(pd, "r") == 1
    assert engine.connector.child_failures() == {"pd": {"request_finished": 1}}
    assert not engine.held("r")


def test_a_load_only_child_still_loads(model: Path) -> None:
    pd, disk = script(tokens=32), script(tokens=16)
    engine = Engine(make_config(model, [with_role("pd", pd, "load"), child("disk", disk)]))
    run_one(engine, "r")
    assert told(pd, "r") == [32] and told(disk, "r") == [0]
    assert finished(pd, "r") == 1 and "r" in engine.outputs


def test_roles_reach_the_core_books_and_the_fanout(model: Path) -> None:
    store, pd = script(), script()
    config = make_config(model, [with_role("store", store, "save"), with_role("pd", pd, "load")])
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        connector = make_connector(config, role)
        registry = connector.tracker.registry
        assert registry.role("store") is Role.save and registry.role("pd") is Role.load
        assert connector.load_tracker.registry.role("pd") is Role.load
        assert connector._kids.fan.of("wait_for_layer_load") == ("pd",)
        assert connector._kids.fan.of("save_kv_layer") == ("store",)
        assert connector._kids.fan.of("start_load_kv") == ("store", "pd")


def test_the_role_key_is_not_passed_to_the_child(model: Path) -> None:
    store = script()
    connector = make_connector(
        make_config(model, [with_role("store", store, "save")]), KVConnectorRole.SCHEDULER
    )
    own = connector.children["store"]._kv_transfer_config.kv_connector_extra_config
    assert ROLE_KEY not in own and "multiconnector_name" not in own


@pytest.mark.parametrize(
    ("role", "error"), [("saver", InvalidValueError), (1, InvalidArgumentError)]
)
def test_a_bad_role_is_refused_naming_the_key_before_any_child_starts(
    model: Path, role: Any, error: type[Exception]
) -> None:
    made, other = script(), script()
    with pytest.raises(error, match=rf"\[1\]\['kv_connector_extra_config'\]\['{ROLE_KEY}'\]"):
        make_connector(
            make_config(model, [child("a", other), with_role("b", made, role)]),
            KVConnectorRole.SCHEDULER,
        )
    assert made.instances == [] and other.instances == []


def test_a_load_only_partial_tail_offer_is_not_made(model: Path) -> None:
    pd, disk = script(tail=True), script(tail=True)
    connector = make_connector(
        make_config(model, [with_role("pd", pd, "load"), child("disk", disk)]),
        KVConnectorRole.SCHEDULER,
    )
    request = make_request("r", num_tokens=PROMPT)
    assert connector.register_finished_partial_tail(request, ([1, 2],), [(0, 0, 1)]) is True
    assert pd.names("register_finished_partial_tail") == []
    assert len(disk.names("register_finished_partial_tail")) == 1


# -- the top-level kv_role against the children's ---------------------------------------------


def with_kv_role(name: str, kv_role: str) -> dict[str, Any]:
    entry = child(name, script())
    entry["kv_role"] = kv_role
    return entry


def role_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "multiconnector"
        and r.levelno == logging.WARNING
        and "kv_role" in r.getMessage()
    ]


@pytest.mark.parametrize(
    ("parent", "children", "named", "advice"),
    [
        # a child produces KV where the top-level kv_role says the engine does not
        ("kv_consumer", {"pd": "kv_consumer", "store": "kv_producer"}, ["store"], "kv_both"),
        # a child consumes KV where the top-level kv_role says the engine does not
        ("kv_producer", {"disk": "kv_both", "pd": "kv_producer"}, ["disk"], "kv_both"),
        ("kv_producer", {"a": "kv_consumer", "b": "kv_both"}, ["a", "b"], "kv_both"),
        # the top-level kv_role says more than every child together
        ("kv_both", {"a": "kv_producer", "b": "kv_producer"}, [], "kv_producer"),
    ],
)
def test_a_top_level_kv_role_the_children_disagree_with_is_warned_about_and_served(
    model: Path,
    caplog: pytest.LogCaptureFixture,
    *,
    parent: str,
    children: dict[str, str],
    named: list[str],
    advice: str,
) -> None:
    config = make_config(
        model, [with_kv_role(name, role) for name, role in children.items()], kv_role=parent
    )
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        engine = Engine(config)  # the scheduler's connector and a worker's
    (message,) = role_warnings(caplog)  # once: from the scheduler's connector
    assert f"kv_transfer_config.kv_role={parent!r}" in message
    for name, role in children.items():
        assert (f"child {name!r} ({role})" in message) is (name in named)
        assert f"{name}={role}" in message  # every child's kv_role listed
    if not named:
        assert "no child consumes KV, which kv_both says this engine does" in message
    assert message.endswith(f"Set kv_role={advice!r}, what the children say together")
    engine.add(make_request("r", num_tokens=PROMPT, max_tokens=2))  # and it serves
    for _ in range(4):
        engine.step()
    assert "r" in engine.outputs


@pytest.mark.parametrize(
    ("parent", "children"),
    [
        ("kv_both", ["kv_both", "kv_both"]),
        ("kv_both", ["kv_producer", "kv_consumer"]),
        ("kv_producer", ["kv_producer", "kv_producer"]),
        ("kv_consumer", ["kv_consumer"]),
    ],
)
def test_a_top_level_kv_role_the_children_agree_with_is_not_warned_about(
    model: Path, caplog: pytest.LogCaptureFixture, parent: str, children: list[str]
) -> None:
    config = make_config(
        model, [with_kv_role(f"c{i}", role) for i, role in enumerate(children)], kv_role=parent
    )
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        make_connector(config, KVConnectorRole.SCHEDULER)
    assert role_warnings(caplog) == []


def test_the_warning_says_which_kv_role_this_vllm_reads(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(model, [with_kv_role("pd", "kv_producer")], kv_role="kv_consumer")
    assert config.kv_transfer_config is not None
    # What this vLLM itself decides from the config: the children's kv_role (0.34) or the
    # top-level one (0.33).
    reads_children = config.kv_transfer_config.is_kv_producer
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        make_connector(config, KVConnectorRole.SCHEDULER)
    (message,) = role_warnings(caplog)
    expected = "the children's kv_role" if reads_children else "the top-level kv_role"
    assert f"This vLLM reads {expected}" in message
