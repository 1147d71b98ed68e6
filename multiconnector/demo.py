"""``multiconnector demo``: a short, real run of the library, printed step by step."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from ._args import Parser
from .aggregator import MultiConnector
from .errors import KeyClashError
from .registry import ConnectorRegistry

__all__ = ["run_cli"]


class _DemoConnector:
    """Saves asynchronously, contributes one params key, can load one request's prefix."""

    def __init__(self, key: str | None, *, saves: bool = True, hits: int = 0) -> None:
        self.key, self.saves, self.hits = key, saves, hits

    def request_finished(
        self, request_id: str, blocks: Sequence[int]
    ) -> tuple[bool, Mapping[str, Any] | None]:
        return self.saves, None if self.key is None else {self.key: len(blocks)}

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int:
        return self.hits


def _parser() -> argparse.ArgumentParser:
    return Parser(prog="multiconnector demo", description=__doc__)


def run_cli(argv: Sequence[str]) -> int:
    _parser().parse_args(argv)
    registry = ConnectorRegistry(
        {
            "cache": _DemoConnector("cached_blocks", hits=16),
            "pd@0": _DemoConnector("pd_blocks"),
            "pd@1": _DemoConnector(None),
            "nixl": None,  # failed to start
        }
    )
    mc = MultiConnector(registry, trace=True)

    def show(what: str, result: object) -> None:
        print(f"  {what:<44} -> {result}")

    print(f"registry: {registry!r}")
    mc.begin("r1")
    show("match_tokens('r1')", f"{mc.match_tokens('r1')} tokens from {mc.get('r1').loader!r}")  # type: ignore[union-attr]
    show("load_finished('r1', 'cache')", mc.load_finished("r1", "cache").value)
    show("load_finished('r1', 'cache') again", mc.load_finished("r1", "cache").value)
    outcome, params = mc.request_finished("r1", [0, 1, 2])
    show("request_finished('r1', 3 blocks)", f"{outcome.value}, params={params}")
    for name in ("nixl", "pd@0", "pd@0", "ghost", "cache"):
        show(f"transfer_finished('r1', {name!r})", mc.transfer_finished("r1", name).value)
    show("held requests taken so far", [r.request_id for r in mc.take()])
    show("transfer_finished('r1', 'pd@1')", mc.transfer_finished("r1", "pd@1").value)
    taken = mc.take()
    show("take()", [(r.request_id, r.state.value) for r in taken])
    print("  r1 history:")
    for s in taken[0].history or ():
        print(f"    {s.event:<18} {s.source.value:>9} -> {s.dest.value:<9} {s.name or ''}")

    mc.begin("r2")
    mc.request_finished("r2", [3])
    show("cancel('r2')", mc.cancel("r2").value)
    show("transfer_finished('r2', 'cache') (late)", mc.transfer_finished("r2", "cache").value)
    for name in ("pd@0", "pd@1"):  # a cancelled request drains: its saves still report
        show(f"transfer_finished('r2', {name!r})", mc.transfer_finished("r2", name).value)
    show("take()", [(r.request_id, r.state.value) for r in mc.take()])

    mc.begin("r3")
    mc.request_finished("r3", [4])
    show("unregister('pd@1') while r3 awaits it", type(mc.unregister("pd@1")).__name__)
    for name in ("cache", "pd@0"):
        show(f"transfer_finished('r3', {name!r})", mc.transfer_finished("r3", name).value)
    show("take()", [(r.request_id, r.state.value, r.abandoned) for r in mc.take()])

    mc.register("pd@1", _DemoConnector("pd_blocks"))  # clashes with pd@0's key
    mc.begin("r4")
    try:
        mc.request_finished("r4", [5])
    except KeyClashError as exc:
        show("request_finished('r4') with a clash", f"KeyClashError: {exc.clashes}")
    r4 = mc.get("r4")
    assert r4 is not None
    show("r4 after the clash", f"{r4.state.value}, awaiting {r4.awaiting}")
    show("cancel('r4')", mc.cancel("r4").value)
    for name in r4.awaiting:
        show(f"transfer_finished('r4', {name!r})", mc.transfer_finished("r4", name).value)
    show("take()", [(r.request_id, r.state.value) for r in mc.take()])
    print("outcome counts:", {o.value: n for o, n in sorted(mc.counts().items())})
    print(f"held requests left: {len(mc)}")
    return 0 if len(mc) == 0 else 1
