"""The public surface: what `import multiconnector` offers, and nothing by accident."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import multiconnector

PUBLIC = [
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


def test_all_is_the_documented_surface_and_sorted() -> None:
    assert multiconnector.__all__ == PUBLIC
    assert sorted(multiconnector.__all__) == multiconnector.__all__


def test_every_export_exists_and_is_documented() -> None:
    for name in multiconnector.__all__:
        obj = getattr(multiconnector, name)
        assert inspect.getdoc(obj), name


def test_no_other_public_names_leak() -> None:
    modules = {m.name for m in pkgutil.iter_modules(multiconnector.__path__)}
    public = {n for n in vars(multiconnector) if not n.startswith("_")}
    assert public - set(multiconnector.__all__) <= modules | {"annotations"}


def test_errors_share_one_root() -> None:
    errors = importlib.import_module("multiconnector.errors")
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, multiconnector.MultiConnectorError), name


def test_state_names() -> None:
    assert [s.value for s in multiconnector.State] == [
        "pending",
        "finishing",
        "finished",
        "cancelled",
    ]
    assert multiconnector.State.finished == "finished"


def test_import_pulls_in_no_optional_dependency() -> None:
    code = (
        "import sys, multiconnector; "
        "bad = {'rich', 'graphviz', 'vllm', 'torch', 'hypothesis'} & set(sys.modules); "
        "print(sorted(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_checks_errors_are_the_packages() -> None:
    """The errors a model check raises are importable from the package, under the one root,
    and are the very classes the check modules raise."""
    _explore = importlib.import_module("multiconnector._explore")
    usermachine = importlib.import_module("multiconnector.usermachine")
    assert multiconnector.NondeterminismError is _explore.NondeterminismError
    assert multiconnector.InvalidMachineError is usermachine.InvalidMachineError
    for cls in (multiconnector.NondeterminismError, multiconnector.InvalidMachineError):
        assert issubclass(cls, multiconnector.MultiConnectorError)
