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
