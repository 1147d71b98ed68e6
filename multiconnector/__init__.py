"""Safe aggregation of several KV-cache transfer connectors.

Connectors live in a :class:`ConnectorRegistry` under unique names; a :class:`MultiConnector`
fans each request out to them and tracks it with a :class:`RequestTransferState` whose states
and transitions are declared once (:mod:`multiconnector.machine`). Late, duplicate, phantom and
unknown events are ignored with a typed :class:`Outcome`; nothing is freed while a connector
still owes a report.
"""

from __future__ import annotations

from .aggregator import MultiConnector
from .errors import (
    ConnectorFailures,
    DuplicateConnectorError,
    DuplicateRequestError,
    InvalidAnswerError,
    InvalidArgumentError,
    InvalidMachineError,
    InvalidNameError,
    InvalidParamsError,
    InvalidValueError,
    KeyClashError,
    MultiConnectorError,
    NondeterminismError,
    RoleError,
    ShutDownError,
    UnknownConnectorError,
    UnknownRequestError,
)
from .ledger import SaveLedger
from .lookup import Lookup
from .machine import RequestTransferState, State, Step
from .outcome import Outcome
from .params import merge_transfer_params
from .registry import Connector, ConnectorRegistry, Role

__version__ = "0.1.0"

__all__ = [
    "Connector",
    "ConnectorFailures",
    "ConnectorRegistry",
    "DuplicateConnectorError",
    "DuplicateRequestError",
    "InvalidAnswerError",
    "InvalidArgumentError",
    "InvalidMachineError",
    "InvalidNameError",
    "InvalidParamsError",
    "InvalidValueError",
    "KeyClashError",
    "Lookup",
    "MultiConnector",
    "MultiConnectorError",
    "NondeterminismError",
    "Outcome",
    "RequestTransferState",
    "Role",
    "RoleError",
    "SaveLedger",
    "ShutDownError",
    "State",
    "Step",
    "UnknownConnectorError",
    "UnknownRequestError",
    "merge_transfer_params",
]
