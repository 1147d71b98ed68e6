"""One search, run once per test process: :func:`check_aggregator` for the tests that need the
same report, and the planted bugs' parameters, split between ``make test`` and ``make test-slow``.

A search is deterministic (the same bound, factory and checker give the same report, figure for
figure, but the wall time), so the tests that read one report each (a verdict, a trace, its
JSON, its diagram) share it instead of exploring the same states again. The key is everything a
search depends on: the keyword arguments, the factory (a planted bug by its name: it is built
anew each time it is installed) and the checker's hooks a test may replace (the canonical form,
whether the registry's order is kept, how a world is copied). A test that replaces any of them
gets a search of its own.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import pytest

from multiconnector import MultiConnector
from multiconnector.check import CheckReport, check_aggregator
from multiconnector.check import run as run_module
from tests.broken_aggregators import CATALOG, Broken

#: The bound the planted bugs are checked in (tests/test_check_broken.py).
BOUND: dict[str, Any] = {"connectors": {"a": "saver", "b": "saver", "none": None}, "requests": 1}

#: The planted load bugs are checked with the load side's alphabet: 8,000 to 10,500 states, 10
#: to 15 s of CPU each (the others: 150 to 1,000 states, under 1 s). ``make test`` checks this
#: one wherever the bug is checked in the tests' bound; ``make test-slow`` the other two, and
#: every load bug where the search is another one (no symmetry, no reduction, the enumerated
#: canonical form: 11 to 24 s each).
LOAD_REPRESENTATIVE = "load completion from an unregistered loader accepted"


def _frozen(value: Any) -> Hashable:
    if isinstance(value, Mapping):
        return tuple((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, set | frozenset):
        return frozenset(value)
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value  # type: ignore[no-any-return]


def _hooks(kwargs: Mapping[str, Any]) -> Hashable:
    """The checker's replaceable parts, as the search with ``kwargs`` would use them."""
    alphabet = run_module._alphabet(kwargs.get("events"))
    registry_order = run_module._registry_order(alphabet, bool(kwargs.get("params", False)))
    return (run_module._canonical_form, registry_order, run_module._fork)


_REPORTS: dict[Hashable, CheckReport] = {}


#: check_aggregator's defaults: an argument given its default is the same search as one left out.
_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(check_aggregator).parameters.items()
    if p.default is not inspect.Parameter.empty
}


def _search(factory: Hashable, kwargs: dict[str, Any]) -> CheckReport:
    given = {k: v for k, v in kwargs.items() if not (k in _DEFAULTS and _DEFAULTS[k] == v)}
    key = (factory, _frozen(given), _hooks(kwargs))
    if key not in _REPORTS:
        if isinstance(factory, str):
            bug = next(b for b in CATALOG if b.name == factory)
            with bug.installed() as built:
                _REPORTS[key] = check_aggregator(**kwargs, factory=built)
        else:
            _REPORTS[key] = check_aggregator(**kwargs, factory=factory)
    return _REPORTS[key]


def checked(factory: Callable[..., MultiConnector] = MultiConnector, **kwargs: Any) -> CheckReport:
    """``check_aggregator(**kwargs, factory=factory)``, the same search once per process.

    Never inside a planted bug's ``installed()``: its patches are not in the key (use
    :func:`checked_bug`)."""
    return _search(factory, kwargs)


def checked_bug(bug: Broken, **bound: Any) -> CheckReport:
    """The planted bug checked in ``bound`` (default: the tests' bound, with the bug's own
    connectors, alphabet and params), installed for the search only; once per process."""
    kwargs = {**BOUND, "connectors": bug.connectors or BOUND["connectors"], **bug.options()}
    kwargs.update(bound)
    return _search(bug.name, kwargs)


def is_load(bug: Broken) -> bool:
    return bug.events is not None and "load_finished" in bug.events


def bugs(*, slow: Callable[[Broken], bool] | None = None) -> list[Any]:
    """The catalog as parameters, with the test ids of ``ids=[b.name for b in CATALOG]``; a bug
    for which ``slow`` says so (default: a load bug but the representative) is marked ``slow``,
    so that ``make test`` leaves it to ``make test-slow``."""
    if slow is None:
        slow = is_slow_load
    return [
        pytest.param(b, id=b.name, marks=[pytest.mark.slow] if slow(b) else []) for b in CATALOG
    ]


def is_slow_load(bug: Broken) -> bool:
    """A load bug checked in the tests' bound, other than :data:`LOAD_REPRESENTATIVE` (a load
    bug checked with connectors of its own, a role's, is checked in a few hundred states)."""
    return is_load(bug) and bug.connectors is None and bug.name != LOAD_REPRESENTATIVE
