"""How a world and its events are shown: the printed state, event labels, JSON data, paths."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .properties import _owes, counted_text, told_text
from .scenario import (
    _APPLY_ANSWERS,
    _HELD,
    _MATCH_ANSWER,
    _PER_REQUEST,
    _TAKEN,
    _UNBORN,
    COUNTED_LOAD,
    COUNTED_SAVE,
    Event,
    _show_view,
    _World,
)


def _describe(world: _World) -> str:
    world.sync()
    parts = []
    for i, r in enumerate(world.requests):
        if r.view is not None:
            text = _show_view(r.view)
            if i in world.queue:
                text += ", queued for take"
        else:
            text = {_UNBORN: "not begun", _HELD: "GONE", _TAKEN: "taken"}[r.phase]
        if r.asking:
            text += ", request_finished asking"
            if r.early:
                text += f" (early reports kept: {', '.join(r.early)})"
        if r.matching:
            text += ", match_tokens asking"
            if r.load_early:
                text += f" (early load reports kept: {', '.join(r.load_early)})"
        owing = _owes(r)
        if owing and (r.view is None or set(r.view[1]) != r.owed or r.load_owed is not None):
            text += f" [owed: {', '.join(owing)}]"
        parts.append(f"{r.request_id} {text}")
    registry = " ".join(n if ready else f"{n}(None)" for n, ready in world.registry)
    return f"{'; '.join(parts)} | registry: {registry or '-'}"


def _label(world: _World) -> Callable[[Event], str]:
    ids = world.scenario.ids

    def label(event: Event) -> str:
        kind = event[0]
        if kind == "request_finished":
            savers = ", ".join(event[2]) or "none"
            text = f"request_finished({ids[event[1]]}) asks; saving: {savers}"
            if len(event) > 3:
                params = ", ".join(f"{n} {c}" for n, c in event[3]) or "none"
                text += f"; params: {params}"
            return text
        if kind == "transfer_finished_many":
            return f"transfer_finished_many({event[1]}, [{', '.join(ids[i] for i in event[2])}])"
        if kind == _APPLY_ANSWERS:
            return f"request_finished({ids[event[1]]}) applies its answers"
        if kind == "request_finished_by":
            return told_text(ids, event)
        if kind == _MATCH_ANSWER:
            return f"match_tokens({ids[event[1]]}) records its loader"
        if kind in ("transfer_finished", "load_finished"):
            return f"{kind}({ids[event[1]]}, {event[2]})"
        if kind == "split_load":
            return f"choose_loader({ids[event[1]]}, {event[2]}, parts=[{event[3]}])"
        if kind in (COUNTED_SAVE, COUNTED_LOAD):
            return counted_text(ids, event)
        if kind == "match_tokens":
            tokens = ", ".join(f"{n}: {t}" for n, t in event[2]) or "nobody asked"
            return f"match_tokens({ids[event[1]]}) tokens: {tokens}"
        if kind in _PER_REQUEST:
            return f"{kind}({ids[event[1]]})"
        if kind == "take":
            return "take()"
        if kind == "cooled":
            return "cooled: the clock passes every cooldown; tick()"
        return f"{kind}({event[1]})"

    return label


def _data(ids: tuple[str, ...]) -> Callable[[Event], Any]:
    def data(event: Event) -> Any:
        if event[0] == "match_tokens":
            return [event[0], ids[event[1]], dict(event[2])]
        if event[0] == "request_finished" and len(event) > 3:
            return [event[0], ids[event[1]], list(event[2]), dict(event[3])]
        if event[0] == "transfer_finished_many":
            return [event[0], event[1], [ids[i] for i in event[2]]]
        if event[0] in _PER_REQUEST:
            return [event[0], ids[event[1]], *event[2:]]
        return list(event)

    return data


def _annotate(world: _World) -> dict[str, Any]:
    """Each request's path, as ``[event, source, dest, name]`` steps (for the diagrams).

    The path is the one the trace applied, event for event: each step is a transition the
    request's record took, with the connector the *applied* event named (the reporting
    connector of a ``transfer_finished``, the unregistered one of a ``connector_gone``), not a
    name the aggregator may have substituted; ``path_steps`` gives the trace step of each.
    """
    world.sync()
    begun = [i for i, r in enumerate(world.requests) if r.phase != _UNBORN]
    paths: dict[str, list[list[Any]]] = {world.requests[i].request_id: [] for i in begun}
    numbers: dict[str, list[int]] = {world.requests[i].request_id: [] for i in begun}
    for step, i, event, new in world.log:
        rid = world.requests[i].request_id
        named = _named(event)
        for s in new:
            paths.setdefault(rid, []).append(
                [s.event, s.source.value, s.dest.value, named if named is not None else s.name]
            )
            numbers.setdefault(rid, []).append(step)
    return {"paths": paths, "path_steps": numbers}


def _named(event: Event) -> str | None:
    """The connector an applied event names, if it names one."""
    kind = event[0]
    if kind in ("unregister", "register"):
        return str(event[1])
    if kind in (COUNTED_SAVE, COUNTED_LOAD):  # the name the world applied it to: the step's
        return None
    if kind in _PER_REQUEST and len(event) > 2 and isinstance(event[2], str):
        return event[2]
    return None
