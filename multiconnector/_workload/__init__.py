"""The simulated serving workload: a scheduler loop over a KV block pool, with injected faults.

One seeded generator draws everything: arrivals, request sizes, which connectors save, latencies,
cancellations and faults. Events sit in one heap ordered by simulated time (integer ticks) and
sequence number, so a run is a pure function of its configuration when ``threads == 1``.

With ``threads > 1`` the scheduler (the main loop, in ``simulation.py``) still makes every
decision, but the connectors' reports are delivered by worker threads (``deliveries.py``), racing
with the scheduler's ``request_finished``, ``cancel``, ``take`` and its unregistering and
registering connectors.
Reports about one request always go to the same worker, in the order they were made (the order a
real connector's messages about one request arrive in), except that a worker delivers each run of
saves as one batch per connector, as a vLLM worker's ``get_finished`` does. Runs are then no
longer reproducible, but every invariant must still hold.

The scheduler acts only on what a real caller knows: what the library returns. It frees
exactly the blocks of the requests :meth:`~multiconnector.MultiConnector.take` hands back, at
once, with no ledger of its own: a cancelled request, or one whose load is still in flight, is
handed back only once no connector may touch its blocks. The block pool checks every free
against the simulated connectors' own ledgers (see :mod:`multiconnector._workload.pool`).

The simulator's parts, from the ground up: ``records.py`` (a simulated request, the tallies),
``pool.py`` (the block pool, the violations), ``connectors.py`` (the simulated connectors and
their ledgers), ``config.py``, ``deliveries.py`` (the reports' way back), ``simulation.py`` (the
scheduler) and ``result.py``. ``multiconnector simulate`` (:mod:`multiconnector.simulate`) is its
command line.
"""

from __future__ import annotations

from .config import CONNECTORS, FAULT_KINDS, SimulationConfig
from .records import SimRequest
from .result import SimulationResult
from .simulation import Simulation

__all__ = [
    "CONNECTORS",
    "FAULT_KINDS",
    "SimRequest",
    "Simulation",
    "SimulationConfig",
    "SimulationResult",
]
