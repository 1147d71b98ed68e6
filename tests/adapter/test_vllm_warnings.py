"""Per-request failures inside vLLM's real Scheduler are warned about as every child failure is
(:class:`~multiconnector.vllm.trouble.Trouble`): at most one line a minute per child and hook,
however many requests fail, each one counted.

The two cases here fail on every request by design of the configuration: a load-only child
that promises saves (``multiconnector_role: load``), and a child that looks up for ever under
``lookup: longest`` (past ``lookup_patience_steps``). Both are the adapter's own verdicts on a
child's answer, not a child raising: their line says why, and carries no traceback (it would
show the adapter's code, never the child's).
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import logging  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm_children import Script, child, script  # noqa: E402
from vllm_harness import Engine, make_config, make_request  # noqa: E402

from multiconnector.vllm import LOOKUP_KEY, PATIENCE_KEY, ROLE_KEY  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

#: Requests per test: every one fails the same way.
N = 24


def run(engine: Engine, *savers: Script) -> None:
    """Run N requests to their end (each saver reporting its saves), in as few steps as the
    scheduler takes."""
    ids = [f"r{i:03}" for i in range(N)]
    for request_id in ids:
        engine.add(make_request(request_id, num_tokens=40, max_tokens=2))
    for _ in range(4 * N):
        engine.step()
        for made in savers:
            made.sending.update(r for r in ids if r in engine.outputs)
        if all(r in engine.outputs and not engine.held(r) for r in ids):
            return
    raise AssertionError("the requests did not finish")


def warned(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "multiconnector"
        and r.levelno == logging.WARNING
        and f"child connector {name!r}" in r.getMessage()
    ]


def test_a_load_only_child_promising_saves_is_warned_about_once_for_every_request(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pd, disk = script(saves=True), script(saves=True)
    pd_entry: dict[str, Any] = child("pd", pd)
    pd_entry["kv_connector_extra_config"][ROLE_KEY] = "load"
    engine = Engine(make_config(model, [pd_entry, child("disk", disk)]))
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        run(engine, disk)
    assert engine.connector.child_failures() == {"pd": {"request_finished": N}}  # each counted
    (line,) = warned(caplog, "pd")  # one line, not one per request
    assert "RoleError" in line.getMessage() and "role=Role.load" in line.getMessage()
    assert line.exc_info is None


def test_a_child_past_its_lookup_patience_is_warned_about_once_for_every_request(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hit, forever = script(tokens=0), script(tokens=None)
    config = make_config(
        model,
        [child("hit", hit), child("stuck", forever)],
        extra={LOOKUP_KEY: "longest", PATIENCE_KEY: 2},
    )
    engine = Engine(config)
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        run(engine)
    assert engine.connector.child_failures() == {"stuck": {"get_num_new_matched_tokens": N}}
    (line,) = warned(caplog, "stuck")
    assert "LookupPatienceError" in line.getMessage()
    assert line.exc_info is None


def test_a_child_raising_is_warned_about_once_with_its_traceback(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A child's own exception keeps its traceback (the first line of the minute): that is
    where the child failed."""
    broken = script(raise_in={"get_num_new_matched_tokens": RuntimeError("disk gone")})
    engine = Engine(make_config(model, [child("broken", broken), child("ok", script())]))
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        run(engine)
    assert engine.connector.child_failures() == {"broken": {"get_num_new_matched_tokens": N}}
    (line,) = warned(caplog, "broken")
    assert line.exc_info is not None and line.exc_info[1] is not None
    assert str(line.exc_info[1]) == "disk gone"
