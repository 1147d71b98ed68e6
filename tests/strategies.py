"""Hypothesis strategies shared by the test suite."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

#: Connector names: short, so that collisions between draws are frequent.
names = st.text(alphabet="abcdxyz@01", min_size=1, max_size=4)

keys = st.text(alphabet="klmn_", min_size=1, max_size=3)
values = st.one_of(
    st.integers(-3, 3), st.text(max_size=3), st.none(), st.lists(st.integers(), max_size=2)
)
params = st.dictionaries(keys, values, max_size=5)
maybe_params = st.one_of(st.none(), params)


@st.composite
def contributions(
    draw: st.DrawFn, *, disjoint: bool = False, min_size: int = 0
) -> list[tuple[str, Any]]:
    """``(name, params | None)`` pairs with unique names; ``disjoint``: no key supplied twice."""
    connector_names = draw(st.lists(names, unique=True, min_size=min_size, max_size=6))
    out: list[tuple[str, Any]] = []
    used: set[str] = set()
    for name in connector_names:
        p = draw(maybe_params)
        if disjoint and p is not None:
            p = {k: v for k, v in p.items() if k not in used}
            used.update(p)
        out.append((name, p))
    return out


#: (awaiting, event argument) pairs that drive every guard of the machine both ways.
GUARD_SCENARIOS: list[tuple[tuple[str, ...], Any]] = [
    ((), ()),
    ((), ("a",)),
    ((), ("a", "b")),
    (("a",), "a"),
    (("a", "b"), "a"),
    (("b", "a"), "a"),
    (("a",), "b"),
    (("a",), None),
]


#: The guard names of generated machines: few, so that guards often overlap or exclude each other.
GUARD_NAMES = ("g", "h")


@st.composite
def machine_declarations(draw: st.DrawFn, max_states: int = 6) -> dict[str, Any]:
    """A small random ``transitions`` declaration: states ``s0``.., initial ``s0``, some final
    (or none), transitions on a few triggers with optional named guards, some internal."""
    n = draw(st.integers(1, max_states))
    states = [f"s{i}" for i in range(n)]
    finals = draw(st.lists(st.sampled_from(states), unique=True, max_size=2))
    transitions: list[Any] = []
    for _ in range(draw(st.integers(0, 2 * n + 2))):
        trigger = draw(st.sampled_from(["a", "b", "c"]))
        source = draw(st.sampled_from(states))
        dest = draw(st.one_of(st.sampled_from(states), st.just("="), st.none()))
        conditions = draw(st.lists(st.sampled_from(GUARD_NAMES), unique=True, max_size=1))
        unless = draw(st.lists(st.sampled_from(GUARD_NAMES), unique=True, max_size=1))
        transitions.append(
            {"trigger": trigger, "source": source, "dest": dest, "conditions": conditions,
             "unless": unless}
        )  # fmt: skip
    declaration: dict[str, Any] = {"states": states, "initial": "s0", "transitions": transitions}
    if finals or draw(st.booleans()):
        declaration["final"] = finals
    return declaration
