"""The outcome counters, in particular a batch's (``transfer_finished_many``), counted exactly.

tests/test_batch.py compares a batch with one call per report; these guards count on their own:
exact figures for both of a batch's lock strategies on every stripe count, a batch that is
interrupted half-way, and the totals against the outcomes the calls returned.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from multiconnector import ConnectorRegistry, MultiConnector, Outcome
from multiconnector.aggregator import OTHER_NAMES
from tests.connectors import Scripted
from tests.stripes import STRIPE_COUNTS, ids_on


def finishing(stripes: int, count: int) -> tuple[MultiConnector, list[str]]:
    """``count`` requests, spread over every stripe, each awaiting ``a`` and ``b``."""
    mc = MultiConnector(
        ConnectorRegistry({"a": Scripted(), "b": Scripted(), "dead": None}), stripes=stripes
    )
    per = -(-count // stripes)
    ids = ids_on(mc, range(stripes), per_stripe=per)[:count]
    for rid in ids:
        mc.begin(rid)
        mc.request_finished(rid)
    return mc, ids


@pytest.mark.parametrize("stripes", STRIPE_COUNTS)
@pytest.mark.parametrize("size", [1, 3, 40])  # below and above half the stripes
def test_a_batch_counts_each_report_once_by_name_and_outcome(stripes: int, size: int) -> None:
    mc, ids = finishing(stripes, size)
    assert mc.counts() == {Outcome.applied: size}  # the request_finished events
    assert mc.transfer_finished_many("a", [*ids, "nobody"]) == [Outcome.applied] * size + [
        Outcome.unknown_request
    ]
    assert mc.transfer_finished_many("a", ids) == [Outcome.duplicate] * size
    assert mc.transfer_finished_many("dead", ids) == [Outcome.not_ready] * size
    assert mc.transfer_finished_many("ghost", ids[:1]) == [Outcome.unknown_connector]
    assert mc.transfer_finished_many("b", ids) == [Outcome.applied] * size
    assert mc.transfer_finished_many("b", ids) == [Outcome.terminal] * size
    assert mc.counts() == {
        Outcome.applied: 3 * size,
        Outcome.unknown_request: 1,
        Outcome.duplicate: size,
        Outcome.not_ready: size,
        Outcome.unknown_connector: 1,
        Outcome.terminal: size,
    }
    assert mc.connector_counts() == {
        "a": {Outcome.applied: size, Outcome.unknown_request: 1, Outcome.duplicate: size},
        "dead": {Outcome.not_ready: size},
        "ghost": {Outcome.unknown_connector: 1},
        "b": {Outcome.applied: size, Outcome.terminal: size},
    }


@pytest.mark.parametrize("stripes", STRIPE_COUNTS)
def test_counts_add_up_to_the_outcomes_returned(stripes: int) -> None:
    mc, ids = finishing(stripes, 50)
    returned: Counter[Outcome] = Counter({Outcome.applied: 50})  # the request_finished events
    for name, batch in [
        ("a", ids[:7]),
        ("a", ids[5:45]),
        ("b", ids[::2]),
        ("ghost", ids[:3]),
        ("b", ids),
        ("a", [*ids, "x", "y"]),
    ]:
        returned.update(mc.transfer_finished_many(name, batch))
    for rid in ids[::9]:
        returned[mc.cancel(rid)] += 1
    returned.update(mc.transfer_finished(rid, "a") for rid in ids[:4])
    assert mc.counts() == dict(returned)
    assert sum(sum(c.values()) for c in mc.connector_counts().values()) == sum(
        returned.values()
    ) - 50 - len(ids[::9])  # request_finished and cancel carry no name


@pytest.mark.parametrize("stripes", STRIPE_COUNTS)
def test_a_batch_interrupted_half_way_counts_what_it_applied_and_releases_its_locks(
    stripes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    mc, ids = finishing(stripes, 8)
    original = MultiConnector._count

    def interrupted(self: MultiConnector, *args: Any) -> None:
        raise KeyboardInterrupt  # as a signal could, on the first ignored report

    monkeypatch.setattr(MultiConnector, "_count", interrupted)
    with pytest.raises(KeyboardInterrupt):
        mc.transfer_finished_many("a", [*ids[:5], "nobody", *ids[5:]])
    monkeypatch.setattr(MultiConnector, "_count", original)
    assert mc.counts() == {Outcome.applied: 8 + 5}
    assert mc.connector_counts() == {"a": {Outcome.applied: 5}}
    # Every stripe lock was released: each request can still be reported (a held lock would
    # hang here until the test's time limit).
    assert mc.transfer_finished_many("a", ids) == [Outcome.duplicate] * 5 + [Outcome.applied] * 3
    assert mc.connector_counts()["a"] == {Outcome.applied: 8, Outcome.duplicate: 5}


def _other_stripe_full(stripe: int) -> tuple[MultiConnector, str, str]:
    """Two stripes; a request on ``stripe`` awaiting saver ``a``, and the other stripe's
    counters full (1 024 made-up names reporting a request held there)."""
    mc = MultiConnector(ConnectorRegistry({"a": Scripted()}), stripes=2)
    rid, other = ids_on(mc, [stripe, 1 - stripe])
    mc.begin(rid)
    mc.request_finished(rid)
    mc.begin(other)
    for i in range(1024):
        assert mc.transfer_finished(other, f"ghost{i}") is Outcome.unknown_connector
    return mc, rid, other


@pytest.mark.parametrize("stripe", [0, 1])
def test_an_abandoned_saver_is_counted_on_the_stripe_of_its_request(stripe: int) -> None:
    # Each stripe keeps at most 1 024 (outcome, name) counters. The unregister scan counts an
    # abandoned saver on its request's stripe: another stripe being full does not fold it away.
    mc, _, other = _other_stripe_full(stripe)
    assert mc.transfer_finished(other, "one-more") is Outcome.unknown_connector
    assert mc.connector_counts()[OTHER_NAMES] == {Outcome.unknown_connector: 1}
    mc.unregister("a")
    assert mc.connector_counts()["a"] == {Outcome.abandoned: 1}


@pytest.mark.parametrize("stripe", [0, 1])
def test_a_batch_counts_each_report_on_the_stripe_of_its_request(stripe: int) -> None:
    # As one transfer_finished call does: a batch holding every lock (one id is half of two
    # stripes) still counts each report on its request's stripe, so another stripe being full
    # does not fold its name away.
    mc, rid, _ = _other_stripe_full(stripe)
    assert mc.transfer_finished_many("fresh", [rid]) == [Outcome.unknown_connector]
    assert mc.transfer_finished_many("a", [rid]) == [Outcome.applied]
    counts = mc.connector_counts()
    assert counts["fresh"] == {Outcome.unknown_connector: 1}
    assert counts["a"] == {Outcome.applied: 1}
    assert OTHER_NAMES not in counts
