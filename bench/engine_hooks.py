"""What the connector's hooks cost inside a real vLLM engine (``bench.engine_row --hooks``).

The engine row measures the whole engine's CPU time per token, ours ÷ vLLM's. The connector's
hooks are about 1 % of that time, and two engine processes of one class differ by more than
that, so the row's ratio says little about where the difference lies. With ``--hooks`` each
engine process (one class each, as in the row) wraps every method of vLLM's connector interface
on its scheduler's and its worker's connector in a timer: the same wrapper on both sides, the
outermost call timed (a hook that calls another hook is counted once). Each round answers the
seconds spent in hooks, per hook, beside the engine thread's CPU time, and the rows say:

- each side's hooks as a share of its engine CPU time;
- the difference, ours - vLLM's, as a share of vLLM's engine CPU time: the adapter's own part
  of the engine row's ratio (the ratio is about 1 + this, give or take the noise between
  processes);
- per hook, µs a call on each side, the largest differences first (printed).

The wrapper's own cost (a Python call and two clock reads, a few hundred ns a call in a warm
loop) is in both sides' figures alike, so the difference holds without it.
"""

from __future__ import annotations

import statistics
import time
import types
from collections.abc import Callable
from typing import Any

__all__ = ["GUARD", "HookTimer", "hook_names", "hook_rows", "largest", "summary"]

#: The difference's guard, as a share of vLLM's engine CPU: today's figure (0.68 % on the tiny
#: model, 0.09 % with 32 layers) with a margin, so a change that makes the hooks dearer shows.
GUARD = 0.01


def hook_names() -> tuple[str, ...]:
    """The methods of vLLM's connector interface an engine calls on a connector instance: the
    plain functions of ``KVConnectorBase_V1`` and ``SupportsHMA`` (not the class methods, which
    vLLM calls on the class, nor the properties)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: PLC0415
        KVConnectorBase_V1,
        SupportsHMA,
    )

    names: dict[str, None] = {}
    for cls in (KVConnectorBase_V1, SupportsHMA):
        for name, value in vars(cls).items():
            if not name.startswith("_") and isinstance(value, types.FunctionType):
                names[name] = None
    return tuple(names)


class HookTimer:
    """Per hook (``"<tag>.<method>"``), the calls and seconds of the connectors it wrapped."""

    def __init__(self) -> None:
        self.calls: dict[str, list[float]] = {}
        self._inside = False

    def wrap(self, connector: Any, tag: str, names: tuple[str, ...] | None = None) -> int:
        """Time every hook of ``names`` (by default :func:`hook_names`) that ``connector`` has,
        under ``tag``; returns how many were wrapped. The timers are instance attributes, which
        vLLM's calls find before the class's methods."""
        wrapped = 0
        for name in hook_names() if names is None else names:
            bound = getattr(connector, name, None)
            if callable(bound):
                setattr(connector, name, self._timed(f"{tag}.{name}", bound))
                wrapped += 1
        return wrapped

    def _timed(self, key: str, bound: Callable[..., Any]) -> Callable[..., Any]:
        entry = self.calls.setdefault(key, [0, 0.0])
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._inside:  # called by another hook: counted in that one's time
                return bound(*args, **kwargs)
            self._inside = True
            start = clock()
            try:
                return bound(*args, **kwargs)
            finally:
                entry[1] += clock() - start
                entry[0] += 1
                self._inside = False

        return timed

    def take(self) -> dict[str, list[float]]:
        """The calls and seconds per hook since the last take (hooks never called left out)."""
        taken = {key: list(entry) for key, entry in self.calls.items() if entry[0]}
        for entry in self.calls.values():
            entry[0], entry[1] = 0, 0.0
        return taken


def summary(rounds: dict[str, list[dict[str, Any]]], pair: tuple[str, str]) -> dict[str, Any]:
    """The hooks' figures of ``pair``'s timed rounds (each round: the engine's ``main`` CPU
    seconds, ``tokens`` and ``hooks``, :meth:`HookTimer.take`'s answer), per repeat in step:
    both sides' shares, the difference's share, and per hook the calls and µs a call."""
    a, b = pair
    shares: dict[str, list[float]] = {a: [], b: []}
    difference: list[float] = []
    per_hook: dict[str, dict[str, list[float]]] = {a: {}, b: {}}
    for mine, theirs in zip(rounds[a], rounds[b], strict=True):
        seconds = {}
        for side, answer in ((a, mine), (b, theirs)):
            spent = sum(entry[1] for entry in answer["hooks"].values())
            seconds[side] = spent / answer["tokens"]
            shares[side].append(spent / answer["main"])
            for key, (calls, spent_in) in answer["hooks"].items():
                total = per_hook[side].setdefault(key, [0, 0.0])
                total[0] += calls
                total[1] += spent_in
        difference.append((seconds[a] - seconds[b]) / (theirs["main"] / theirs["tokens"]))
    return {
        "share": {side: statistics.median(v) for side, v in shares.items()},
        "difference": statistics.median(difference),
        "difference_range": [min(difference), max(difference)],
        "per_hook_us": {
            side: {key: [int(n), s / n * 1e6] for key, (n, s) in hooks.items()}
            for side, hooks in per_hook.items()
        },
    }


def hook_rows(figures: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The table rows (``bench/run.py``'s Row fields) of :func:`summary`'s figures, under the
    row ``name`` (``engine``, or ``engine, N layers:``)."""
    share, difference = figures["share"], figures["difference"]
    low, high = figures["difference_range"]
    return [
        {"name": f"{name} hooks' share of engine CPU, ours", "median": share["ours"] * 100,
         "p90": float("nan"), "unit": "%", "target": "", "met": None},
        {"name": f"{name} hooks' share of engine CPU, vLLM's MultiConnector",
         "median": share["vllm"] * 100, "p90": float("nan"), "unit": "%", "target": "",
         "met": None},
        {"name": f"{name} hooks, ours - vLLM's, share of vLLM's engine CPU",
         "median": difference * 100, "p90": high * 100, "p10": low * 100, "unit": "%",
         "target": f"≤ {GUARD:.2%} (guard)", "met": difference <= GUARD},
    ]  # fmt: skip


def largest(figures: dict[str, Any], most: int = 12) -> list[str]:
    """Lines: per hook, µs a call on each side and the total difference, largest first."""
    ours, theirs = figures["per_hook_us"]["ours"], figures["per_hook_us"]["vllm"]

    def total(side: dict[str, list[float]], key: str) -> float:
        calls, us = side.get(key, (0, 0.0))
        return calls * us

    keys = sorted(set(ours) | set(theirs), key=lambda k: total(theirs, k) - total(ours, k))
    lines = []
    for key in keys[:most]:
        n_ours, us_ours = ours.get(key, (0, 0.0))
        n_theirs, us_theirs = theirs.get(key, (0, 0.0))
        difference = total(ours, key) - total(theirs, key)
        lines.append(
            f"  {key:40s} ours {n_ours:6d} x {us_ours:6.2f} µs   vLLM's {n_theirs:6d} x "
            f"{us_theirs:6.2f} µs   difference {difference / 1e3:+7.2f} ms"
        )
    return lines
