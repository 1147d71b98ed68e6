"""Interleavings that need two threads, forced deterministically at the racy point."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from multiconnector import (
    ConnectorRegistry,
    DuplicateRequestError,
    MultiConnector,
    Outcome,
    State,
)
from multiconnector.aggregator import OTHER_NAMES
from tests.connectors import Scripted


def test_unregister_while_request_finished_applies_never_strands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The unregister scan cannot miss a request whose awaited set is being written."""
    inside, go = threading.Event(), threading.Event()
    original = MultiConnector._intern

    def paused(self: MultiConnector, names: tuple[str, ...]) -> tuple[str, ...]:
        # Runs under the request's stripe lock, after the registry was checked.
        if threading.current_thread().name == "finisher" and not inside.is_set():
            inside.set()
            go.wait(5)
        return original(self, names)

    monkeypatch.setattr(MultiConnector, "_intern", paused)
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(), "b": Scripted(saves=False)}))
    mc.begin("r")
    mc.register("c", Scripted())
    finisher = threading.Thread(target=mc.request_finished, args=("r",), name="finisher")
    finisher.start()
    assert inside.wait(5)
    remover = threading.Thread(target=mc.unregister, args=("a",))
    remover.start()
    time.sleep(0.05)  # the remover now waits for the finisher's stripe lock
    go.set()
    finisher.join(5)
    remover.join(5)
    record = mc.get("r")
    assert record is not None
    assert (record.awaiting, record.abandoned) == (("c",), ("a",))
    assert mc.transfer_finished("r", "c") is Outcome.applied
    assert [r.state for r in mc.take()] == [State.finished]


def test_a_second_concurrent_request_finished_is_a_duplicate_and_asks_nobody() -> None:
    entered, release = threading.Event(), threading.Event()

    class Slow(Scripted):
        def request_finished(
            self, request_id: str, blocks: Sequence[int]
        ) -> tuple[bool, Mapping[str, Any] | None]:
            entered.set()
            release.wait(5)
            return super().request_finished(request_id, blocks)

    slow = Slow()
    mc = MultiConnector(ConnectorRegistry({"slow": slow}))
    mc.begin("r")
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(mc.request_finished("r")))
    first.start()
    assert entered.wait(5)
    assert mc.request_finished("r") == (Outcome.duplicate, None)
    release.set()
    first.join(5)
    assert results == [(Outcome.applied, None)]
    assert len(slow.finished_calls) == 1  # asked once: one promise, one awaited name
    assert mc.get("r").awaiting == ("slow",)  # type: ignore[union-attr]


def test_a_call_that_claims_just_after_another_finished_asks_nobody() -> None:
    # The second call takes its first look (pending) while the first call is asking, and claims
    # the moment the first one releases its claim. It must then see the state the first wrote
    # and ask nobody, or its connectors would promise saves nobody tracks.
    asking, release, at_claim, released, claimed = (threading.Event() for _ in range(5))
    second: list[threading.Thread] = []

    class Gate(dict[str, object]):
        """Holds the second call at its claim until the first releases its own, then holds
        the first (inside its update) until the second has claimed."""

        def setdefault(self, key: str, default: object = None) -> object:
            if not (second and threading.current_thread() is second[0]):
                return super().setdefault(key, default)
            at_claim.set()
            assert released.wait(5)
            try:
                return super().setdefault(key, default)
            finally:
                claimed.set()

        def __delitem__(self, key: str) -> None:
            super().__delitem__(key)
            if second and threading.current_thread() is not second[0]:
                released.set()
                assert claimed.wait(5)

    class Holding(Scripted):
        def request_finished(
            self, request_id: str, blocks: Sequence[int]
        ) -> tuple[bool, Mapping[str, Any] | None]:
            asking.set()
            assert release.wait(5)
            return super().request_finished(request_id, blocks)

    holder = Holding()
    mc = MultiConnector(ConnectorRegistry({"h": holder}))
    mc._asking = Gate()
    mc.begin("r")
    results: dict[str, Any] = {}

    runner = threading.Thread(target=lambda: results.update(first=mc.request_finished("r")))
    runner.start()
    assert asking.wait(5)  # the first call holds its claim and asks
    second.append(threading.Thread(target=lambda: results.update(second=mc.request_finished("r"))))
    second[0].start()
    assert at_claim.wait(5)  # the second call saw "pending" and is about to claim
    release.set()
    runner.join(5)
    second[0].join(5)
    assert results == {"first": (Outcome.applied, None), "second": (Outcome.duplicate, None)}
    assert len(holder.finished_calls) == 1  # asked once
    assert mc.get("r").awaiting == ("h",)  # type: ignore[union-attr]


def test_a_claim_is_released_when_a_connector_raises_a_base_exception() -> None:
    class Interrupted(Scripted):
        def request_finished(
            self, request_id: str, blocks: Sequence[int]
        ) -> tuple[bool, Mapping[str, Any] | None]:
            raise KeyboardInterrupt

    mc = MultiConnector(ConnectorRegistry({"x": Interrupted()}))
    mc.begin("r")
    with pytest.raises(KeyboardInterrupt):
        mc.request_finished("r")
    mc.unregister("x")
    assert mc.request_finished("r")[0] is Outcome.applied  # not refused as a duplicate


def test_counters_stay_bounded_under_made_up_names() -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted()}), stripes=1)
    mc.begin("r")
    mc.request_finished("r")
    for i in range(5_000):
        assert mc.transfer_finished("r", f"made-up-{i}") is Outcome.unknown_connector
    per = mc.connector_counts()
    assert len(per) <= 1_025
    assert sum(n for counts in per.values() for n in counts.values()) == 5_000
    assert per[OTHER_NAMES][Outcome.unknown_connector] > 3_000
    assert mc.counts()[Outcome.unknown_connector] == 5_000


def test_a_cancel_while_request_finished_asks_keeps_every_promised_save() -> None:
    # A slow connector answers after a cancel overtook the call: its promise is recorded and
    # awaited, and take() hands nothing back before it reported.
    mc: MultiConnector
    seen: dict[str, Any] = {}

    class Canceller(Scripted):
        def request_finished(
            self, request_id: str, blocks: Sequence[int]
        ) -> tuple[bool, Mapping[str, Any] | None]:
            seen["cancel"] = mc.cancel(request_id)
            seen["taken"] = mc.take()  # the call still asks: not safe to free yet
            with pytest.raises(DuplicateRequestError):
                mc.begin(request_id)
            return super().request_finished(request_id, blocks)

    mc = MultiConnector(ConnectorRegistry({"a": Canceller(), "b": Scripted(saves=False)}))
    mc.begin("r")
    assert mc.request_finished("r") == (Outcome.overtaken, None)
    assert seen == {"cancel": Outcome.applied, "taken": []}
    record = mc.get("r")
    assert record is not None
    assert (record.state, record.awaiting, record.expected) == (State.cancelled, ("a",), ("a",))
    assert mc.take() == [] and mc.held() == {"live": 0, "draining": 1, "queued": 0}
    assert mc.transfer_finished("r", "a") is Outcome.drained
    (taken,) = mc.take()
    assert (taken.state, taken.awaiting) == (State.cancelled, ())
    assert mc.counts()[Outcome.overtaken] == 1


def test_a_cancel_while_request_finished_asks_nobody_saving_frees_after_the_call() -> None:
    mc: MultiConnector
    taken_inside: list[Any] = []

    class Canceller(Scripted):
        def request_finished(
            self, request_id: str, blocks: Sequence[int]
        ) -> tuple[bool, Mapping[str, Any] | None]:
            if not self.finished_calls:  # only the first call is overtaken
                mc.cancel(request_id)
                taken_inside.extend(mc.take())
            return super().request_finished(request_id, blocks)

    mc = MultiConnector(ConnectorRegistry({"a": Canceller(saves=False)}))
    mc.begin("r")
    assert mc.request_finished("r") == (Outcome.overtaken, None)
    assert taken_inside == []
    assert [r.state for r in mc.take()] == [State.cancelled]  # released by the call's end
    mc.begin("r")  # the id may be used again
    assert mc.request_finished("r") == (Outcome.applied, None)


def test_request_finished_by_while_request_finished_asks_is_a_duplicate() -> None:
    # Otherwise the asking call's connectors would commit to saves the record never awaits.
    mc: MultiConnector
    by: list[Outcome] = []

    class Asker(Scripted):
        def request_finished(
            self, request_id: str, blocks: Sequence[int]
        ) -> tuple[bool, Mapping[str, Any] | None]:
            by.append(mc.request_finished_by(request_id, ()))
            return super().request_finished(request_id, blocks)

    mc = MultiConnector(ConnectorRegistry({"a": Asker()}))
    mc.begin("r")
    assert mc.request_finished("r") == (Outcome.applied, None)
    assert by == [Outcome.duplicate]
    assert mc.get("r").awaiting == ("a",)  # type: ignore[union-attr]
    assert mc.request_finished_by("r", ("a",)) is Outcome.duplicate  # finishing already
    assert mc.counts()[Outcome.duplicate] == 2


@pytest.mark.parametrize("event", ["request_finished", "request_finished_by"])
def test_an_interrupt_right_after_the_claim_leaks_no_claim(event: str) -> None:
    # A signal's KeyboardInterrupt can land just after the claim is made.
    fire = [True]

    class Interrupting(dict[object, object]):
        def setdefault(self, key: object, default: object = None) -> object:
            made = super().setdefault(key, default)
            if fire:
                fire.clear()
                raise KeyboardInterrupt
            return made

    mc = MultiConnector(ConnectorRegistry({"a": Scripted(saves=False)}))
    mc._asking = Interrupting()
    mc.begin("r")
    finish = getattr(mc, event)
    args: tuple[Any, ...] = ("r",) if event == "request_finished" else ("r", ())
    with pytest.raises(KeyboardInterrupt):
        finish(*args)
    assert dict(mc._asking) == {}
    outcome = finish(*args)
    assert (outcome[0] if isinstance(outcome, tuple) else outcome) is Outcome.applied
