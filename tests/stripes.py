"""Request ids chosen by the lock stripe they land on, whatever the string hash seed.

The aggregator picks a request's stripe as ``hash(request_id) & (stripes - 1)`` (its ``_mask``).
``str`` hashes change from one process to the next (``PYTHONHASHSEED``), so a test that fixes an
id exercises a different stripe on each run; these helpers search ids in this process instead.
``tests/test_races.py`` checks that they agree with the lock the aggregator really takes.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

from multiconnector import MultiConnector

#: The aggregator's default number of stripes.
DEFAULT_STRIPES: int = inspect.signature(MultiConnector).parameters["stripes"].default

#: The stripe counts the race and thread tests run with: one lock, two, and the default.
STRIPE_COUNTS = (1, 2, DEFAULT_STRIPES)

#: (stripes, stripe) pairs: the first and the last stripe of each count, and one between.
CHOSEN = sorted({(n, s) for n in STRIPE_COUNTS for s in (0, n // 2, n - 1)})


def stripe_of(mc: MultiConnector, request_id: str) -> int:
    """The stripe whose lock guards ``request_id`` in ``mc``."""
    return hash(request_id) & mc._mask


def ids_on(
    mc: MultiConnector, stripes: Iterable[int], per_stripe: int = 1, prefix: str = "req"
) -> list[str]:
    """``per_stripe`` ids on each of ``stripes`` (listed stripe by stripe, in the given order)."""
    wanted = list(dict.fromkeys(stripes))
    count = len(mc._locks)
    for stripe in wanted:
        if not 0 <= stripe < count:
            raise ValueError(f"stripe={stripe} is not one of the {count} stripes")
    found: dict[int, list[str]] = {stripe: [] for stripe in wanted}
    missing = len(wanted) * per_stripe
    i = 0
    while missing:
        rid = f"{prefix}-{i}"
        i += 1
        bucket = found.get(stripe_of(mc, rid))
        if bucket is not None and len(bucket) < per_stripe:
            bucket.append(rid)
            missing -= 1
    return [rid for stripe in wanted for rid in found[stripe]]


def spread(count: int, per_stripe: int, prefix: str = "req") -> list[str]:
    """``per_stripe`` ids on each stripe of ``count`` stripes, round robin over the stripes.

    ``count`` is a power of two, so ids spread evenly over it are spread evenly over every
    smaller stripe count too (a stripe of 2 is the low bit of a stripe of 64).
    """
    mc = MultiConnector(stripes=count)
    by_stripe = [ids_on(mc, [s], per_stripe, f"{prefix}-{s}") for s in range(count)]
    return [ids[k] for k in range(per_stripe) for ids in by_stripe]
