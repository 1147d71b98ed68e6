"""The model check knows roles: ``store`` (save-only) and ``loader`` (load-only) connectors.

The planted bugs that break a role are in tests/broken_aggregators.py, checked by
tests/test_check_broken.py; here, the real aggregator passes with every role, and the new
kinds are taken by the function and the command line.
"""

from __future__ import annotations

from typing import Any

import pytest

from multiconnector import Role
from multiconnector.check import ALPHABET, LOAD_EVENTS, ROLES_KEPT, check_aggregator, run_cli
from multiconnector.check import run as run_module
from multiconnector.errors import InvalidValueError
from tests.checked import checked

pytestmark = pytest.mark.timeout(120)  # model-check bounds: longer than the default time limit

LOAD = ALPHABET + LOAD_EVENTS


@pytest.mark.parametrize(
    "bound",
    [
        {"connectors": {"s": "store"}, "events": LOAD},
        {"connectors": {"l": "loader"}, "events": LOAD},
        {"connectors": {"a": "saver", "s": "store", "l": "loader"}},
        {"connectors": {"s": "store", "l": "loader"}, "events": LOAD},
        {"connectors": {"s": "store", "l": "loader"}, "requests": 2},
    ],
    ids=["store-load", "loader-load", "saver-store-loader", "store-loader-load", "two-requests"],
)
def test_the_real_aggregator_keeps_every_role(bound: dict[str, Any]) -> None:
    report = checked(**{"requests": 1, **bound})
    assert report.ok and report.finished, report.to_text()
    names = [p.name for p in report.properties]
    assert names.index(ROLES_KEPT) == names.index("callbacks") + 1
    # The loader promised a save at every request_finished: RoleError is its documented path.
    assert report.result("no exception").passed


def test_a_report_without_a_role_has_no_roles_property() -> None:
    report = checked(connectors={"a": "saver"}, requests=1)
    assert ROLES_KEPT not in [p.name for p in report.properties]


def test_the_scenario_registers_each_kind_with_its_role() -> None:
    kinds = {"a": "saver", "s": "store", "l": "loader", "n": None}
    scenario, probe = run_module._scenario(
        kinds,
        (),
        1,
        frozenset(ALPHABET),
        run_module.MultiConnector,
        symmetry=True,
        params=False,
    )
    registry = probe.mc.registry
    assert [registry.role(n) for n in kinds] == [Role.both, Role.save, Role.load, Role.both]
    assert scenario.batchers == ("a", "s")  # a loader is never awaited, so never batched


def test_the_bounds_show_the_roles() -> None:
    report = checked(connectors={"s": "store", "l": "loader"}, requests=1)
    assert report.bounds["connectors"] == ["s (store: Role.save)", "l (loader: Role.load)"]


def test_an_unknown_kind_is_refused_naming_every_kind() -> None:
    with pytest.raises(InvalidValueError, match="'saver', 'raises', 'garbage', 'store', 'loader'"):
        check_aggregator({"a": "reader"})


def test_cli_takes_the_role_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--connectors", "s=store,l=loader", "--requests", "1", "--load", "--no-progress"]
    assert run_cli(argv) == 0
    out = capsys.readouterr().out
    assert "s (store: Role.save), l (loader: Role.load)" in out
    assert f"PASS  {ROLES_KEPT}:" in out


def test_cli_refuses_an_unknown_kind_naming_the_role_kinds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_cli(["--connectors", "a=reader"]) == 2
    assert "NAME=saver|none|raises|garbage|store|loader" in capsys.readouterr().err


def test_copied_worlds_explore_exactly_what_replayed_ones_do_with_roles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bound: dict[str, Any] = {"connectors": {"s": "store", "l": "loader"}, "requests": 1}
    copied = check_aggregator(**bound, events=LOAD).to_dict()
    monkeypatch.setattr(run_module, "_fork", lambda world: None)
    replayed = check_aggregator(**bound, events=LOAD).to_dict()
    for timing in ("wall_time", "distinct_per_second", "generated_per_second"):
        copied.pop(timing)
        replayed.pop(timing)
    assert copied == replayed
