"""Interleavings that need two threads, forced deterministically at the racy point."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from multiconnector import (
    ConnectorFailures,
    ConnectorRegistry,
    DuplicateRequestError,
    KeyClashError,
    MultiConnector,
    Outcome,
    State,
)
from multiconnector.aggregator import OTHER_NAMES
from multiconnector.check import halves
from tests.connectors import Scripted
from tests.stripes import CHOSEN, STRIPE_COUNTS, ids_on, stripe_of


class Tracked:
    """A stripe lock that notes each thread that asks for it, before it waits."""

    def __init__(self, lock: Any, index: int, asked: list[tuple[str, int]]) -> None:
        self._lock, self._index, self._asked = lock, index, asked

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self._asked.append((threading.current_thread().name, self._index))
        return bool(self._lock.acquire(blocking, timeout))

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def tracked(mc: MultiConnector) -> list[tuple[str, int]]:
    """Replace ``mc``'s stripe locks by ones that record who asks for which stripe."""
    asked: list[tuple[str, int]] = []
    mc._locks = tuple(Tracked(lock, i, asked) for i, lock in enumerate(mc._locks))
    return asked


def striped(
    connectors: dict[str, Scripted | None], stripes: int, stripe: int
) -> tuple[MultiConnector, str]:
    """An aggregator with ``stripes`` locks, and a request id on ``stripe``."""
    mc = MultiConnector(ConnectorRegistry(connectors), stripes=stripes)
    (rid,) = ids_on(mc, [stripe])
    return mc, rid


CHOSEN_IDS = [f"{n}-stripes-#{s}" for n, s in CHOSEN]


@pytest.mark.parametrize("stripes", STRIPE_COUNTS)
def test_each_event_takes_the_lock_of_the_stripe_the_tests_compute(stripes: int) -> None:
    # The helpers in tests/stripes.py must agree with the aggregator, or the tests below would
    # exercise other stripes than they say.
    mc = MultiConnector(ConnectorRegistry({"a": Scripted()}), stripes=stripes)
    asked = tracked(mc)
    ids = ids_on(mc, range(stripes))
    assert [stripe_of(mc, rid) for rid in ids] == list(range(stripes))
    for rid in ids:
        mc.begin(rid)
        for event, args in (
            (mc.request_finished, (rid,)),
            (mc.transfer_finished, (rid, "a")),
            (mc.cancel, (rid,)),
            (mc.get, (rid,)),
        ):
            asked.clear()
            event(*args)  # type: ignore[operator]
            assert asked == [("MainThread", stripe_of(mc, rid))], event


def unregister_while_request_finished_applies(
    stripes: int, stripe: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request on ``stripe`` is paused inside request_finished's update, under its stripe lock,
    after the registry was checked; meanwhile a saver it is about to await is unregistered."""
    inside, go = threading.Event(), threading.Event()
    original = MultiConnector._intern

    def paused(self: MultiConnector, names: tuple[str, ...]) -> tuple[str, ...]:
        if threading.current_thread().name == "finisher" and not inside.is_set():
            inside.set()
            go.wait(5)
        return original(self, names)

    monkeypatch.setattr(MultiConnector, "_intern", paused)
    mc, rid = striped({"a": Scripted(), "b": Scripted(saves=False)}, stripes, stripe)
    asked = tracked(mc)
    mc.begin(rid)
    mc.register("c", Scripted())
    finisher = threading.Thread(target=mc.request_finished, args=(rid,), name="finisher")
    finisher.start()
    assert inside.wait(5)
    remover = threading.Thread(target=mc.unregister, args=("a",), name="remover")
    remover.start()
    # The remover either waits for the finisher's stripe (right) or scans without it (a bug that
    # would miss the request): wait for one or the other, no sleep, no luck involved.
    deadline = time.monotonic() + 5
    while ("remover", stripe) not in asked and remover.is_alive():
        assert time.monotonic() < deadline, "the remover neither waits nor finishes"
        time.sleep(0.0005)
    go.set()
    finisher.join(5)
    remover.join(5)
    assert not finisher.is_alive() and not remover.is_alive()
    record = mc.get(rid)
    assert record is not None
    assert (record.awaiting, record.abandoned) == (("c",), ("a",)), (stripes, stripe)
    assert mc.transfer_finished(rid, "c") is Outcome.applied
    assert [r.state for r in mc.take()] == [State.finished]


@pytest.mark.parametrize("stripes", STRIPE_COUNTS)
def test_unregister_while_request_finished_applies_never_strands_on_any_stripe(
    stripes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unregister scan cannot miss a request whose awaited set is being written, whichever
    stripe the request is on: every stripe of each count is tried."""
    for stripe in range(stripes):
        with monkeypatch.context() as patch:
            unregister_while_request_finished_applies(stripes, stripe, patch)


class Reregistering(Scripted):
    """A saver that, while it is asked, unregisters its own name and registers it again."""

    def __init__(self, replacement: Scripted | None = None) -> None:
        super().__init__()
        self.replacement = replacement
        self.mc: MultiConnector | None = None  # None: an ordinary saver

    def request_finished(
        self, request_id: str, blocks: Sequence[int]
    ) -> tuple[bool, Mapping[str, Any] | None]:
        if self.mc is not None:
            self.mc.unregister("s")
            self.mc.register("s", self if self.replacement is None else self.replacement)
        return super().request_finished(request_id, blocks)


@pytest.mark.parametrize("again", ["itself", "another"])
@pytest.mark.parametrize(("stripes", "stripe"), CHOSEN, ids=CHOSEN_IDS)
def test_a_saver_that_reregisters_while_asked_is_abandoned_not_awaited(
    stripes: int, stripe: int, again: str
) -> None:
    # The unregister rule: the registration that promised the save was unregistered, so it can
    # never report. The request must not await the name (the new registration promised nothing
    # and would strand it): "s" is expected and abandoned at once, and its later reports are
    # ignored. The other saver is still awaited.
    replacement = Scripted() if again == "another" else None
    saver = Reregistering(replacement)
    other = Scripted()
    mc, rid = striped({"s": saver, "o": other}, stripes, stripe)
    saver.mc = mc
    mc.begin(rid)
    assert mc.request_finished(rid) == (Outcome.applied, None)
    record = mc.get(rid)
    assert record is not None
    assert (record.state, record.awaiting) == (State.finishing, ("o",))
    assert (record.expected, record.abandoned) == (("s", "o"), ("s",))
    assert mc.transfer_finished(rid, "s") is Outcome.unregistered
    assert mc.transfer_finished(rid, "o") is Outcome.applied
    assert [(r.state, r.abandoned) for r in mc.take()] == [(State.finished, ("s",))]
    assert saver.on_finished_calls == [] and (replacement is None or not replacement.finished_calls)
    assert mc.connector_counts()["s"] == {Outcome.unregistered: 1}


@pytest.mark.parametrize(("stripes", "stripe"), CHOSEN, ids=CHOSEN_IDS)
def test_a_lone_saver_that_reregisters_while_asked_finishes_the_request(
    stripes: int, stripe: int
) -> None:
    # Nothing left to await: the request is finished at once, and "s" is abandoned.
    saver = Reregistering()
    mc, rid = striped({"s": saver}, stripes, stripe)
    saver.mc = mc
    mc.begin(rid)
    assert mc.request_finished(rid) == (Outcome.applied, None)
    (record,) = mc.take()
    assert (record.state, record.awaiting, record.abandoned) == (State.finished, (), ("s",))
    assert mc.transfer_finished(rid, "s") is Outcome.unknown_request  # taken: forgotten
    assert "s" in mc.registry  # registered again, free for the next requests
    mc.begin(rid)
    saver.mc = None  # no more tricks: an ordinary saver now
    assert mc.request_finished(rid) == (Outcome.applied, None)
    assert mc.get(rid).awaiting == ("s",)  # type: ignore[union-attr]


@pytest.mark.parametrize(("stripes", "stripe"), CHOSEN, ids=CHOSEN_IDS)
def test_a_second_concurrent_request_finished_is_a_duplicate_and_asks_nobody(
    stripes: int, stripe: int
) -> None:
    entered, release = threading.Event(), threading.Event()

    class Slow(Scripted):
        def request_finished(
            self, request_id: str, blocks: Sequence[int]
        ) -> tuple[bool, Mapping[str, Any] | None]:
            entered.set()
            release.wait(5)
            return super().request_finished(request_id, blocks)

    slow = Slow()
    mc, rid = striped({"slow": slow}, stripes, stripe)
    mc.begin(rid)
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(mc.request_finished(rid)))
    first.start()
    assert entered.wait(5)
    assert mc.request_finished(rid) == (Outcome.duplicate, None)
    release.set()
    first.join(5)
    assert results == [(Outcome.applied, None)]
    assert len(slow.finished_calls) == 1  # asked once: one promise, one awaited name
    assert mc.get(rid).awaiting == ("slow",)  # type: ignore[union-attr]


@pytest.mark.parametrize(("stripes", "stripe"), CHOSEN, ids=CHOSEN_IDS)
def test_a_call_that_claims_just_after_another_finished_asks_nobody(
    stripes: int, stripe: int
) -> None:
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
    mc, rid = striped({"h": holder}, stripes, stripe)
    mc._asking = Gate()
    mc.begin(rid)
    results: dict[str, Any] = {}

    runner = threading.Thread(target=lambda: results.update(first=mc.request_finished(rid)))
    runner.start()
    assert asking.wait(5)  # the first call holds its claim and asks
    second.append(threading.Thread(target=lambda: results.update(second=mc.request_finished(rid))))
    second[0].start()
    assert at_claim.wait(5)  # the second call saw "pending" and is about to claim
    release.set()
    runner.join(5)
    second[0].join(5)
    assert results == {"first": (Outcome.applied, None), "second": (Outcome.duplicate, None)}
    assert len(holder.finished_calls) == 1  # asked once
    assert mc.get(rid).awaiting == ("h",)  # type: ignore[union-attr]


@pytest.mark.parametrize(("stripes", "stripe"), CHOSEN, ids=CHOSEN_IDS)
def test_a_claim_is_released_when_a_connector_raises_a_base_exception(
    stripes: int, stripe: int
) -> None:
    class Interrupted(Scripted):
        def request_finished(
            self, request_id: str, blocks: Sequence[int]
        ) -> tuple[bool, Mapping[str, Any] | None]:
            raise KeyboardInterrupt

    mc, rid = striped({"x": Interrupted()}, stripes, stripe)
    mc.begin(rid)
    with pytest.raises(KeyboardInterrupt):
        mc.request_finished(rid)
    mc.unregister("x")
    assert mc.request_finished(rid)[0] is Outcome.applied  # not refused as a duplicate


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


@pytest.mark.parametrize(("stripes", "stripe"), CHOSEN, ids=CHOSEN_IDS)
def test_request_finished_by_while_request_finished_asks_is_a_duplicate(
    stripes: int, stripe: int
) -> None:
    # Otherwise the asking call's connectors would commit to saves the record never awaits.
    mc: MultiConnector
    rid: str
    by: list[Outcome] = []

    class Asker(Scripted):
        def request_finished(
            self, request_id: str, blocks: Sequence[int]
        ) -> tuple[bool, Mapping[str, Any] | None]:
            by.append(mc.request_finished_by(request_id, ()))
            return super().request_finished(request_id, blocks)

    mc, rid = striped({"a": Asker()}, stripes, stripe)
    mc.begin(rid)
    assert mc.request_finished(rid) == (Outcome.applied, None)
    assert by == [Outcome.duplicate]
    assert mc.get(rid).awaiting == ("a",)  # type: ignore[union-attr]
    assert mc.request_finished_by(rid, ("a",)) is Outcome.duplicate  # finishing already
    assert mc.counts()[Outcome.duplicate] == 2


@pytest.mark.parametrize(("stripes", "stripe"), CHOSEN, ids=CHOSEN_IDS)
@pytest.mark.parametrize("event", ["request_finished", "request_finished_by"])
def test_an_interrupt_right_after_the_claim_leaks_no_claim(
    event: str, stripes: int, stripe: int
) -> None:
    # A signal's KeyboardInterrupt can land just after the claim is made.
    fire = [True]

    class Interrupting(dict[object, object]):
        def setdefault(self, key: object, default: object = None) -> object:
            made = super().setdefault(key, default)
            if fire:
                fire.clear()
                raise KeyboardInterrupt
            return made

    mc, rid = striped({"a": Scripted(saves=False)}, stripes, stripe)
    mc._asking = Interrupting()
    mc.begin(rid)
    finish = getattr(mc, event)
    args: tuple[Any, ...] = (rid,) if event == "request_finished" else (rid, ())
    with pytest.raises(KeyboardInterrupt):
        finish(*args)
    assert dict(mc._asking) == {}
    outcome = finish(*args)
    assert (outcome[0] if isinstance(outcome, tuple) else outcome) is Outcome.applied


@pytest.mark.parametrize(("stripes", "stripe"), CHOSEN, ids=CHOSEN_IDS)
@pytest.mark.parametrize("event", ["request_finished", "request_finished_by"])
def test_an_interrupted_update_drops_its_own_claim_and_no_other(
    event: str, stripes: int, stripe: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A KeyboardInterrupt lands in the update (_finish), after which the update still drops
    # its claim; the request is still pending, so another call claims it that instant (a claim
    # takes no lock). The interrupted call's clean-up must leave that claim alone: dropped, a
    # third call would claim too and ask the connectors a second time.
    others: list[object] = []

    class ClaimedMeanwhile(dict[object, object]):
        def __delitem__(self, key: object) -> None:
            super().__delitem__(key)
            if not others:
                others.append(object())
                self[key] = others[0]  # the other call's claim, made right after ours went

    def interrupted(*args: Any) -> Outcome:
        raise KeyboardInterrupt

    a = Scripted()
    mc, rid = striped({"a": a}, stripes, stripe)
    mc._asking = ClaimedMeanwhile()
    mc.begin(rid)
    record = mc.peek(rid)
    finish = getattr(mc, event)
    args: tuple[Any, ...] = (rid,) if event == "request_finished" else (rid, ["a"])
    with monkeypatch.context() as patched:
        patched.setattr(MultiConnector, "_finish", interrupted)
        with pytest.raises(KeyboardInterrupt):
            finish(*args)
    assert dict(mc._asking) == {id(record): others[0]}  # the other call's, still held
    assert mc.request_finished(rid) == (Outcome.duplicate, None)  # asks nobody
    assert len(a.finished_calls) == (event == "request_finished")


@pytest.mark.parametrize("stripes", STRIPE_COUNTS)
def test_the_load_side_and_given_savers_take_the_lock_of_the_requests_stripe(
    stripes: int,
) -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(tokens=2)}), stripes=stripes)
    asked = tracked(mc)
    for rid in ids_on(mc, range(stripes)):
        mc.begin(rid)
        for event, args, rounds in (
            # twice: marked as asked (its load reports are early), then the loader recorded
            (mc.match_tokens, (rid,), 2),
            (mc.load_finished, (rid, "a"), 1),
            (mc.request_finished_by, (rid, ["a"]), 1),
            (mc.request_finished_by, (rid, ["a"]), 1),  # refused: counted under the lock too
        ):
            asked.clear()
            event(*args)  # type: ignore[operator]
            assert asked == [("MainThread", stripe_of(mc, rid))] * rounds, event


def test_a_request_taken_while_oldest_copies_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(saves=False)}))
    for rid in ("r1", "r2", "r3"):
        mc.begin(rid)
    original = MultiConnector.get

    def taken_meanwhile(self: MultiConnector, request_id: str) -> Any:
        return None if request_id == "r1" else original(self, request_id)

    monkeypatch.setattr(MultiConnector, "get", taken_meanwhile)
    assert [r.request_id for r in mc.oldest(2)] == ["r2", "r3"]


def test_a_loader_unregistered_just_after_its_load_applied_is_not_called_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loader = Scripted(tokens=2)
    mc = MultiConnector(ConnectorRegistry({"a": loader}))
    mc.begin("r")
    mc.match_tokens("r")
    original = ConnectorRegistry.entry

    def unregistered_meanwhile(self: ConnectorRegistry, name: str) -> Any:
        if self._entries.get(name) is not None:
            self.unregister(name)  # between the update and the callback
        return original(self, name)

    monkeypatch.setattr(ConnectorRegistry, "entry", unregistered_meanwhile)
    assert mc.load_finished("r", "a") is Outcome.applied
    assert loader.loads == []


def test_a_cancel_then_an_interrupt_while_asked_hands_the_request_back_once() -> None:
    # The cancel parks the record (the call still asks); the interrupt's release hands it to
    # take(), once, even when a later call claims and releases the same record.
    mc: MultiConnector

    class CancelThenInterrupt(Scripted):
        def request_finished(self, request_id: str, blocks: Sequence[int]) -> Any:
            assert mc.cancel(request_id) is Outcome.applied
            raise KeyboardInterrupt

    mc = MultiConnector(ConnectorRegistry({"a": CancelThenInterrupt()}))
    mc.begin("r")
    with pytest.raises(KeyboardInterrupt):
        mc.request_finished("r")
    assert [(r.request_id, r.state) for r in mc.take()] == [("r", State.cancelled)]
    mc.begin("s")
    with pytest.raises(KeyboardInterrupt):
        mc.request_finished("s")
    assert mc.request_finished_by("s", []) is Outcome.terminal  # claims, refused, releases
    assert [(r.request_id, r.state) for r in mc.take()] == [("s", State.cancelled)]
    assert mc.take() == [] and len(mc) == 0


def test_a_cancel_between_the_claim_and_the_update_of_given_savers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted()}))
    original = MultiConnector._finish_by

    def cancelled_first(self: MultiConnector, request_id: str, *args: Any) -> Outcome:
        assert self.cancel(request_id) is Outcome.applied  # parked: the call holds its claim
        assert self.take() == []
        return original(self, request_id, *args)

    monkeypatch.setattr(MultiConnector, "_finish_by", cancelled_first)
    mc.begin("r")
    assert mc.request_finished_by("r", ["a"]) is Outcome.terminal
    assert [(r.request_id, r.state, r.awaiting) for r in mc.take()] == [("r", State.cancelled, ())]


def test_a_cancel_and_an_unregister_while_asked_abandon_the_gone_saver() -> None:
    # a promised a save; b, asked next, cancels the request and unregisters a: the overtaken
    # request drains b alone and names a as abandoned.
    mc: MultiConnector

    class CancelAndUnregister(Scripted):
        def request_finished(self, request_id: str, blocks: Sequence[int]) -> Any:
            assert mc.cancel(request_id) is Outcome.applied
            mc.unregister("a")
            return super().request_finished(request_id, blocks)

    mc = MultiConnector(ConnectorRegistry({"a": Scripted(), "b": CancelAndUnregister()}))
    mc.begin("r")
    assert mc.request_finished("r") == (Outcome.overtaken, None)
    record = mc.get("r")
    assert record is not None
    assert (record.state, record.awaiting, record.expected, record.abandoned) == (
        State.cancelled,
        ("b",),
        ("a", "b"),
        ("a",),
    )
    assert mc.take() == []
    assert mc.transfer_finished("r", "b") is Outcome.drained
    assert [r.abandoned for r in mc.take()] == [("a",)]


def test_request_finisheds_two_halves_apply_as_one_call_would() -> None:
    # The model check runs request_finished as two events, ask then answer, with any other
    # event in between: the claim is held from the first half to the second.
    a = Scripted(params={"k": 1})
    mc = MultiConnector(ConnectorRegistry({"a": a}))
    mc.begin("r")
    assert halves.ask(mc, "nobody", []) == (Outcome.unknown_request, None)
    asked = halves.ask(mc, "r", [4])
    assert a.finished_calls == [("r", (4,))]
    assert mc.get("r").state is State.pending  # type: ignore[union-attr]
    assert mc.request_finished("r") == (Outcome.duplicate, None)  # the claim is held
    assert halves.answer(mc, asked) == (Outcome.applied, {"k": 1})
    assert mc.get("r").awaiting == ("a",)  # type: ignore[union-attr]
    mc.begin("s")  # one call again: both halves at once
    assert mc.request_finished("s") == (Outcome.applied, {"k": 1})
    assert len(a.finished_calls) == 2


def test_request_finisheds_second_half_raises_what_the_first_half_met() -> None:
    # A connector that raised and a params clash, met while asking, are raised by the second
    # half, after it applied the answers, as one call raises them.
    boom = RuntimeError("disk full")
    mc = MultiConnector(
        ConnectorRegistry(
            {
                "a": Scripted(params={"k": 1}),
                "bad": Scripted(raises=boom),
                "b": Scripted(params={"k": 2}),
            }
        )
    )
    mc.begin("r")
    asked = halves.ask(mc, "r", [])
    with pytest.raises(ConnectorFailures) as info:
        halves.answer(mc, asked)
    first, clash = info.value.exceptions
    assert first is boom and isinstance(clash, KeyClashError)
    assert info.value.failed == ("bad",)
    assert info.value.result == (Outcome.applied, None)
    assert mc.get("r").awaiting == ("a", "b")  # type: ignore[union-attr]
    mc.begin("s")  # only the clash: raised alone
    mc.unregister("bad")
    asked = halves.ask(mc, "s", [])
    with pytest.raises(KeyClashError) as alone:
        halves.answer(mc, asked)
    assert alone.value.result == (Outcome.applied, None)  # type: ignore[attr-defined]


@pytest.mark.parametrize("stripes", [n for n in STRIPE_COUNTS if n > 1])  # 1: always every lock
def test_a_batch_of_half_the_stripes_takes_every_lock_once_a_smaller_one_its_own(
    stripes: int,
) -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted()}), stripes=stripes)
    half = stripes >> 1
    ids = ids_on(mc, range(stripes), per_stripe=2)
    for rid in ids:
        mc.begin(rid)
        mc.request_finished(rid)
    asked = tracked(mc)
    small, large = ids[: half - 1], ids[half : 2 * half]
    assert mc.transfer_finished_many("a", small) == [Outcome.applied] * len(small)
    assert asked == [("MainThread", stripe_of(mc, rid)) for rid in small]
    asked.clear()
    assert mc.transfer_finished_many("a", large) == [Outcome.applied] * len(large)
    assert asked == [("MainThread", stripe) for stripe in range(stripes)]


def test_a_callback_that_changes_the_registry_does_not_stop_the_batchs_callbacks() -> None:
    mc: MultiConnector

    class Registering(Scripted):
        def on_finished(self, request_id: str, blocks: Sequence[int]) -> None:
            super().on_finished(request_id, blocks)
            if request_id == "r1":
                mc.register("z", Scripted())  # a new registry snapshot; "a" is unchanged

    a = Registering()
    mc = MultiConnector(ConnectorRegistry({"a": a}))
    for rid in ("r1", "r2"):
        mc.begin(rid)
        mc.request_finished(rid)
    assert mc.transfer_finished_many("a", ["r1", "r2"]) == [Outcome.applied] * 2
    assert [rid for rid, _ in a.on_finished_calls] == ["r1", "r2"]


def test_a_request_cancelled_just_before_the_claim_asks_nobody_and_keeps_no_claim() -> None:
    a = Scripted()
    mc = MultiConnector(ConnectorRegistry({"a": a}))
    mc.begin("r")
    fire = [True]

    class CancelledFirst(dict[object, object]):
        def setdefault(self, key: object, default: object = None) -> object:
            if fire:  # another thread's cancel, just before our claim
                fire.clear()
                assert mc.cancel("r") is Outcome.applied
            return super().setdefault(key, default)

    mc._asking = CancelledFirst()
    assert mc.request_finished("r") == (Outcome.terminal, None)
    assert a.finished_calls == [] and dict(mc._asking) == {}
    assert mc.request_finished_by("r", []) is Outcome.terminal  # not a duplicate: unclaimed
    assert [r.state for r in mc.take()] == [State.cancelled]
