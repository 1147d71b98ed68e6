"""The drop-in: a vLLM MultiConnector configuration with one added line, HMA, and vLLM's API."""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import dataclasses  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (  # noqa: E402
    MultiConnector as VllmMultiConnector,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm.version import __version__ as VLLM_VERSION  # noqa: E402
from vllm_children import MOCKED, ScriptedConnector, child, script  # noqa: E402
from vllm_harness import (  # noqa: E402
    builtin_config,
    make_config,
    make_connector,
    make_hybrid_kv_cache_config,
    make_kv_cache_config,
    make_request,
)

from multiconnector.vllm import (  # noqa: E402
    ChildStartError,
    HMAUnsupportedError,
    MultiConnector,
    hooks,
)
from multiconnector.vllm.connector import ADOPTED  # noqa: E402
from multiconnector.vllm.errors import UncomposedHookError  # noqa: E402
from multiconnector.vllm.worker import RULED_FIELDS, _extra_fields  # noqa: E402

pytestmark = pytest.mark.vllm

MC = MultiConnector

#: Copied verbatim from vLLM's docs (vllm-project/vllm, docs/features/disagg_prefill.md, the
#: MultiConnector example of ``--kv-transfer-config``).
VLLM_DOCS_CONFIG = (
    '{"kv_connector":"MultiConnector","kv_role":"kv_both","kv_connector_extra_config":'
    '{"connectors":[{"kv_connector":"NixlConnector","kv_role":"kv_both"},'
    '{"kv_connector":"ExampleConnector","kv_role":"kv_both",'
    '"kv_connector_extra_config":{"shared_storage_path":"local_storage"}}]}}'
)
ONE_LINE = {"kv_connector_module_path": "multiconnector.vllm"}


def docs_config(model: Path) -> Any:
    transfer = {**json.loads(VLLM_DOCS_CONFIG), **ONE_LINE}
    config = make_config(model, [])
    config.kv_transfer_config = KVTransferConfig(**transfer)
    return config


def test_vllms_documented_config_with_one_line_loads_our_class(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the example's relative shared_storage_path
    config = docs_config(model)
    transfer = config.kv_transfer_config
    assert KVConnectorFactory.get_connector_class(transfer) is MultiConnector
    built = make_connector(config, KVConnectorRole.SCHEDULER)
    assert type(built) is MultiConnector
    assert list(built.children) == ["NixlConnector", "ExampleConnector"]
    assert isinstance(built.sub_connectors[0], NixlConnector)
    # NixlConnector's worker needs the NIXL library (and a GPU): here it fails to start, named.
    with pytest.raises(ChildStartError) as caught:
        make_connector(config, KVConnectorRole.WORKER)
    assert (caught.value.name, caught.value.started) == ("NixlConnector", ())
    # vLLM's string checks on "MultiConnector" see our children.
    assert transfer.has_connector("NixlConnector")
    assert transfer.has_connector("ExampleConnector")
    assert not transfer.has_connector("OffloadingConnector")
    # ExampleConnector has no SupportsHMA: vLLM's config check reads our children and says so.
    assert KVConnectorFactory.supports_hma_config(transfer) is False


def test_without_the_line_vllms_own_class_is_built(model: Path, tmp_path: Path) -> None:
    config = docs_config(model)
    config.kv_transfer_config.kv_connector_module_path = None
    assert KVConnectorFactory.get_connector_class(config.kv_transfer_config) is VllmMultiConnector


# -- HMA ------------------------------------------------------------------------------------------

HMA_CHILDREN = [
    {"kv_connector": "NixlConnector", "kv_role": "kv_producer"},
    {"kv_connector": "DecodeBenchConnector", "kv_role": "kv_both"},
]


def test_hma_enabled_construction_works_where_every_child_supports_it(model: Path) -> None:
    config = builtin_config(model, HMA_CHILDREN, ours=True, kv_role="kv_producer", hma=True)
    assert KVConnectorFactory.supports_hma_config(config.kv_transfer_config) is True
    built = KVConnectorFactory.create_connector(
        config, KVConnectorRole.SCHEDULER, make_hybrid_kv_cache_config()
    )
    assert isinstance(built, MultiConnector)
    assert isinstance(built, SupportsHMA)
    assert MultiConnector.all_children_support_hma(config.kv_transfer_config) is True


def test_hma_enabled_with_a_child_without_it_is_refused_naming_it(
    model: Path, tmp_path: Path
) -> None:
    example = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
    }
    config = builtin_config(model, [HMA_CHILDREN[1], example], ours=True, hma=True)
    # Through the factory, vLLM's own check refuses it first (it reads our children)...
    with pytest.raises(ValueError, match="does not support HMA"):
        make_connector(config, KVConnectorRole.SCHEDULER)
    # ...and built directly, ours does, before any child is built.
    with pytest.raises(HMAUnsupportedError, match=r"\['ExampleConnector'\]"):
        MultiConnector(config, KVConnectorRole.SCHEDULER, make_hybrid_kv_cache_config())


def finished_request(request_id: str) -> Any:
    request = make_request(request_id)
    request.kv_transfer_params = {"do_remote_decode": True}
    request.status = RequestStatus.FINISHED_LENGTH_CAPPED
    request.num_computed_tokens = 40
    return request


def test_request_finished_all_groups_answers_as_vllms_does(model: Path) -> None:
    """Same hybrid inputs, both classes: the same answer, every group's blocks included."""
    answers = []
    for ours in (True, False):
        config = builtin_config(model, HMA_CHILDREN, ours=ours, kv_role="kv_producer", hma=True)
        built = KVConnectorFactory.create_connector(
            config, KVConnectorRole.SCHEDULER, make_hybrid_kv_cache_config()
        )
        request = finished_request("r1")
        built.on_new_request(request)
        answers.append(built.request_finished_all_groups(request, ([1, 2, 3], [0, 3])))
    assert answers[0] == answers[1]
    saves, params = answers[0]
    assert saves is True
    assert params["remote_block_ids"] == ([1, 2, 3], [0, 3])


def test_without_hma_children_request_finished_all_groups_takes_one_group(model: Path) -> None:
    a = script(saves=True, params={"x": 1})
    built = make_connector(make_config(model, [child("a", a)]), KVConnectorRole.SCHEDULER)
    request = make_request("r1")
    built.on_new_request(request)
    assert built.request_finished_all_groups(request, ([4, 5],)) == (True, {"x": 1})
    assert built.saving == {"r1": ("a",)}
    other = make_request("r2")
    built.on_new_request(other)
    with pytest.raises(HMAUnsupportedError, match="exactly one KV cache group"):
        built.request_finished_all_groups(other, ([4], [5]))


# -- parity with vLLM's API ---------------------------------------------------------------------


def test_matching_stops_at_the_first_child_still_looking_up(model: Path) -> None:
    asked = []
    for ours in (True, False):
        a, b, c = script(tokens=16), script(tokens=None), script(tokens=32)
        built = make_connector(
            make_config(model, [child("a", a), child("b", b), child("c", c)], ours=ours),
            KVConnectorRole.SCHEDULER,
        )
        request = make_request("r1")
        built.on_new_request(request)
        answer = built.get_num_new_matched_tokens(request, 0)
        asked.append((answer, [len(s.names("get_num_new_matched_tokens")) for s in (a, b, c)]))
    assert asked[0] == asked[1] == ((None, False), [1, 1, 0])


def test_loaded_group_ids_come_from_the_chosen_child(model: Path) -> None:
    answers = []
    for ours in (True, False):
        a, b = script(tokens=0), script(tokens=16, load_async=True, groups=(1,))
        built = make_connector(
            make_config(model, [child("a", a), child("b", b)], ours=ours),
            KVConnectorRole.SCHEDULER,
        )
        request = make_request("r1")
        built.on_new_request(request)
        assert built.get_num_new_matched_tokens(request, 0) == (16, True)
        answers.append(built.get_loaded_kv_cache_group_ids(request))
    assert answers == [(1,), (1,)]


def public(cls: type[Any]) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def composed_by_us(cls: type[Any], name: str) -> bool:
    """Whether ``cls``'s ``name`` is code of this package (not the base's, nor adopted)."""
    member = inspect.getattr_static(cls, name, None)
    function = getattr(member, "__func__", getattr(member, "fget", member))
    return str(getattr(function, "__module__", "")).startswith("multiconnector.")


def check_every_hook_decided(*bases: type[Any]) -> None:
    """The guard: every public hook of ``bases`` (vLLM's base class, ``SupportsHMA``) is composed
    by ours (``hooks.COMPOSED``, in this package's code) or inherited on purpose
    (``hooks.INHERITED``, with the reason); an AssertionError naming every other one."""
    undecided = hooks.undecided(*bases)
    assert not undecided, (
        f"vLLM {VLLM_VERSION}'s connector base class has hooks nobody decided on: {undecided}; "
        "compose each in MultiConnector and list it in multiconnector/vllm/hooks.py's "
        "COMPOSED, or list it in INHERITED with the reason"
    )
    api = set().union(*(public(base) for base in bases))
    listed_only = sorted(n for n in api & hooks.COMPOSED.keys() if not composed_by_us(MC, n))
    assert not listed_only, f"in hooks.COMPOSED but not composed by MultiConnector: {listed_only}"
    both = sorted(n for n in hooks.INHERITED if composed_by_us(MC, n) or n in hooks.COMPOSED)
    assert not both, f"in hooks.INHERITED but composed: {both}"


def test_every_base_method_is_composed_or_listed_as_inherited() -> None:
    """Fails the day vLLM's base class (or SupportsHMA) gains a hook nobody decided on."""
    check_every_hook_decided(KVConnectorBase_V1, SupportsHMA)
    assert hooks.undecided(KVConnectorBase_V1, SupportsHMA) == []
    assert ADOPTED == {}  # nothing of vLLM's class taken over on a tested vLLM


def test_the_guard_fails_naming_a_hook_a_newer_base_class_has() -> None:
    patched = type(
        "PatchedBase", (KVConnectorBase_V1,), {"release_kv_lease": lambda self, request: None}
    )
    with pytest.raises(AssertionError, match=r"\['release_kv_lease'\]"):
        check_every_hook_decided(patched, SupportsHMA)


def test_the_guard_fails_naming_a_hook_listed_as_composed_that_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hook listed in hooks.COMPOSED whose code is the base's (not ours) fails the guard."""
    monkeypatch.setattr(MC, "get_finished_count", KVConnectorBase_V1.get_finished_count)
    with pytest.raises(
        AssertionError, match=r"not composed by MultiConnector: \['get_finished_count'\]"
    ):
        check_every_hook_decided(KVConnectorBase_V1, SupportsHMA)


# -- the runtime rule for a hook of a newer vLLM ---------------------------------------------------

NEW_HOOK = "release_kv_lease"


def base_default(self: Any, request: Any) -> str:
    """The patched base class's default of the new hook."""
    return "base default"


def theirs_composition(self: Any, request: Any) -> list[Any]:
    """vLLM's patched MultiConnector's composition of it: every child's answer, in order."""
    return [child.release_kv_lease(request) for child in self._connectors]


def theirs_private_composition(self: Any, request: Any) -> Any:
    """A composition that reads vLLM's class's private books, which ours does not keep."""
    return self._requests_to_connector.get(request.request_id)


def named_answer(self: Any, request: Any) -> str:
    """Each scripted child's answer to the new hook: its script's label."""
    return str(self.script.label)


def newer_vllm(
    monkeypatch: pytest.MonkeyPatch, composition: Any | None
) -> tuple[type[Any], dict[str, str]]:
    """vLLM's base class with one more public hook (scripted children answer it by label), and
    vLLM's MultiConnector composing it (``composition``, or not at all); a fresh subclass of
    ours, given what the rule gives it."""
    monkeypatch.setattr(KVConnectorBase_V1, NEW_HOOK, base_default, raising=False)
    monkeypatch.setattr(ScriptedConnector, NEW_HOOK, named_answer, raising=False)
    if composition is not None:
        monkeypatch.setattr(VllmMultiConnector, NEW_HOOK, composition, raising=False)
    fresh = type("NewerMultiConnector", (MC,), {})
    adopted = hooks.adopt(fresh, (KVConnectorBase_V1, SupportsHMA), VllmMultiConnector)
    return fresh, adopted


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "tested range" in r.getMessage()]


def test_a_new_hook_vllms_class_composes_is_composed_so_over_our_children_with_one_warning(
    model: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fresh, adopted = newer_vllm(monkeypatch, theirs_composition)
    assert adopted == {NEW_HOOK: hooks.THEIRS}
    with pytest.raises(AssertionError, match=NEW_HOOK):
        check_every_hook_decided(KVConnectorBase_V1, SupportsHMA)
    a, b = script(), script()
    config = make_config(model, [child("b", b), child("a", a)])
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        built = fresh(config, KVConnectorRole.SCHEDULER, make_kv_cache_config())
    warned = warnings_of(caplog)
    assert len(warned) == 1
    assert VLLM_VERSION in warned[0] and "0.32-0.34" in warned[0]
    assert f"{NEW_HOOK}: {hooks.THEIRS}" in warned[0]
    # vLLM's composition, over our children in configuration order.
    assert built.release_kv_lease(make_request("r1")) == [b.label, a.label]
    assert NEW_HOOK in vars(fresh)  # vLLM's override-completeness test reads __dict__
    assert NEW_HOOK not in vars(MC)  # the rule ran on the fresh class only


def test_a_new_hook_vllms_class_inherits_keeps_the_base_default_with_one_warning(
    model: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fresh, adopted = newer_vllm(monkeypatch, None)
    assert adopted == {NEW_HOOK: hooks.BASES}
    config = make_config(model, [child("a", script())])
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        built = fresh(config, KVConnectorRole.SCHEDULER, make_kv_cache_config())
    (warned,) = warnings_of(caplog)
    assert f"{NEW_HOOK}: {hooks.BASES}" in warned
    assert built.release_kv_lease(make_request("r1")) == "base default"


def test_a_new_hook_whose_composition_reads_vllms_private_books_refuses_to_start(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh, adopted = newer_vllm(monkeypatch, theirs_private_composition)
    assert adopted == {NEW_HOOK: hooks.THEIRS}
    a = script()
    config = make_config(model, [child("a", a)])
    with pytest.raises(UncomposedHookError, match=r"release_kv_lease \(reads _requests_to_") as e:
        fresh(config, KVConnectorRole.SCHEDULER, make_kv_cache_config())
    assert e.value.hooks == {NEW_HOOK: ("_requests_to_connector",)}
    assert VLLM_VERSION in str(e.value) and "0.32-0.34" in str(e.value)
    assert a.shutdowns == 1  # the child built before the refusal was shut down


@pytest.mark.parametrize(("version", "warned"), [("0.35.0", 1), ("0.31.2", 1), ("0.34.1", 0)])
def test_a_vllm_outside_the_tested_range_is_warned_about_once(
    version: str,
    warned: int,
    model: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("multiconnector.vllm.connector.VLLM_VERSION", version)
    config = make_config(model, [child("a", script())])
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        make_connector(config, KVConnectorRole.SCHEDULER)
    found = warnings_of(caplog)
    assert len(found) == warned
    if warned:
        assert f"vLLM {version} is outside the tested range 0.32-0.34" in found[0]
        assert "does not compose itself: none" in found[0]


def test_what_a_composition_reads_off_self_is_found() -> None:
    assert hooks.reads(theirs_private_composition) == {"_requests_to_connector"}
    assert hooks.reads(theirs_composition) == {"_connectors"}
    assert "_kids" in hooks.reads(inspect.getattr_static(MC, "may_load_async"))
    assert hooks.reads(VllmMultiConnector.__dict__["sub_connectors"]) == {"_connectors"}  # property
    assert hooks.reads(VllmMultiConnector.__dict__["all_children_support_hma"]) == set()


#: Fields of vLLM's KVConnectorTransferResults passed through by name, not ruled, on purpose.
PASSED_THROUGH: dict[str, str] = {}


def test_every_transfer_results_field_is_ruled_or_passed_through() -> None:
    """Fails the day vLLM's KVConnectorTransferResults gains (or loses) a field we did not decide
    on; until it is decided, the worker passes such a field through by name."""
    names = {field.name for field in dataclasses.fields(KVConnectorTransferResults)}
    assert names >= RULED_FIELDS, f"ruled but gone from vLLM: {sorted(RULED_FIELDS - names)}"
    undecided = names - RULED_FIELDS - set(PASSED_THROUGH)
    assert not undecided, f"rule it, or list in PASSED_THROUGH with a reason: {sorted(undecided)}"
    assert set(_extra_fields(KVConnectorTransferResults)) == names - RULED_FIELDS


def test_vllms_multiconnector_api_is_ours_too() -> None:
    """Everything public on vLLM's MultiConnector exists on ours, with the same kind."""
    for name in public(VllmMultiConnector):
        theirs = inspect.getattr_static(VllmMultiConnector, name)
        ours = inspect.getattr_static(MultiConnector, name)
        assert type(ours) is type(theirs), name


def test_the_migration_example_in_the_docs_is_vllms_plus_one_line(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = (Path(__file__).parents[2] / "docs" / "vllm.md").read_text(encoding="utf-8")
    block = page.split("```json\n", 1)[1].split("```", 1)[0]
    documented = json.loads(block)
    assert documented == {**json.loads(VLLM_DOCS_CONFIG), **ONE_LINE}
    monkeypatch.chdir(tmp_path)
    config = make_config(model, [])
    config.kv_transfer_config = KVTransferConfig(**documented)
    built = make_connector(config, KVConnectorRole.SCHEDULER)
    assert type(built) is MultiConnector


MOCKED_CHILD = {
    "kv_connector": "MockedChild",
    "kv_connector_module_path": "vllm_children",
    "kv_role": "kv_both",
}


@pytest.mark.parametrize("ours", [True, False], ids=["ours", "vllm"])
@pytest.mark.parametrize("role", [KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER])
def test_construction_calls_no_child_method(model: Path, role: Any, ours: bool) -> None:
    """Built, neither class calls a child's method; ours asks every child's finished count
    once, when vLLM asks it (on the scheduler, after bind_kv_cache_manager), in order."""
    MOCKED.clear()
    built = make_connector(make_config(model, [MOCKED_CHILD, MOCKED_CHILD], ours=ours), role)
    assert len(MOCKED) == 2
    assert [m.method_calls for m in MOCKED] == [[], []]
    assert built.get_finished_count() is None
    assert built.get_finished_count() is None
    # Ours asks each child once and keeps the counts; vLLM's class asks every time.
    asked = [1, 1] if ours else [2, 2]
    assert [m.get_finished_count.call_count for m in MOCKED] == asked
