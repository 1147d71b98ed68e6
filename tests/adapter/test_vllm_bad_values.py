"""The adapter's configuration (``kv_connector_extra_config``): a value out of range is a
``ValueError`` (:class:`InvalidValueError`), a wrong type an :class:`InvalidArgumentError`, as
everywhere (``tests/test_bad_values.py``); each names the value."""

# ruff: noqa: E501  (VLLM_CASES is a table: one row a line)

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

from typing import Any  # noqa: E402

import pytest  # noqa: E402

from multiconnector import (  # noqa: E402
    DuplicateConnectorError,
    InvalidArgumentError,
    InvalidNameError,
    InvalidValueError,
)
from multiconnector.vllm.config import child_specs  # noqa: E402


def _child(**fields: Any) -> dict[str, Any]:
    return {"kv_connector": "ExampleConnector", "kv_role": "kv_both", **fields}


VLLM_CASES: list[tuple[str, Any, type[Exception], str]] = [
    ("connectors=[]", {"connectors": []}, InvalidValueError, "['connectors']=[]"),
    ("connectors missing", {}, InvalidArgumentError, "['connectors']=None"),
    ("connectors='x'", {"connectors": "x"}, InvalidArgumentError, "['connectors']='x'"),
    ("kv_connector=''", {"connectors": [_child(kv_connector="")]}, InvalidValueError, "['kv_connector']=''"),
    ("kv_connector=3", {"connectors": [_child(kv_connector=3)]}, InvalidArgumentError, "['kv_connector']=3"),
    ("a 'name' key", {"connectors": [_child(name="disk")]}, InvalidValueError, "['name']='disk'"),
    ("kv_role='bogus'", {"connectors": [_child(kv_role="bogus")]}, InvalidValueError, "[0] (name='ExampleConnector')"),
    ("an unknown field", {"connectors": [_child(bogus=1)]}, InvalidValueError, "[0] (name='ExampleConnector')"),
    ("multiconnector_name=''", {"connectors": [_child(kv_connector_extra_config={"multiconnector_name": ""})]}, InvalidNameError, "['multiconnector_name']=''"),
    ("a name twice", {"connectors": [_child(), _child(kv_connector_extra_config={"multiconnector_name": "ExampleConnector"})]}, DuplicateConnectorError, "'ExampleConnector'"),
    ("extra_config=[]", [], InvalidArgumentError, "kv_connector_extra_config=[]"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "error", "words"), [c[1:] for c in VLLM_CASES], ids=[c[0] for c in VLLM_CASES]
)
def test_a_bad_vllm_child_config_raises_its_class_naming_it(
    extra: Any, error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        child_specs(extra)
    assert type(info.value) is error, repr(info.value)
    assert isinstance(info.value, ValueError) == (
        error not in (InvalidArgumentError, InvalidNameError)
    )
    assert words in str(info.value), str(info.value)
