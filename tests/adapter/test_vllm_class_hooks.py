"""vLLM 0.34's three new hooks, ours against vLLM's own class, on one table of configurations.

``kv_cache_access`` and ``supports_lookahead_block_hashes`` are class-level: vLLM asks them while
it resolves its config, before anything starts, and lays the KV cache out from the first (the
extensible KV cache, on CUDA and ROCm). ``may_load_async`` routes a waiting request to the
in-flight load queue (``--max-num-inflight-kv-loads``). Each is asked of both classes on the same
real vLLM config objects, the way vLLM asks it (``KVTransferConfig.kv_cache_access()``, the
factory's class, the real ``Scheduler``), and the answers must be equal, and the expected ones.
Where our roles (``multiconnector_role``) differ from vLLM's class, which has none, ours is
compared with vLLM's class on the children that play that part. A child that raises or answers
garbage: docs/vllm.md's failure table, held at the end.

Nothing here needs a GPU: what vLLM would lay out on one is a config-level answer, read on the
CPU with the platform's two questions answered as a CUDA machine's (``test_..._lays_out``).
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import logging  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (  # noqa: E402
    ExampleConnector,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (  # noqa: E402
    MultiConnector as VllmMultiConnector,
)
from vllm.version import __version__ as VLLM_VERSION  # noqa: E402

if not hasattr(KVConnectorBase_V1, "kv_cache_access"):
    pytest.skip(
        f"vLLM {VLLM_VERSION} has no kv_cache_access, supports_lookahead_block_hashes or "
        "may_load_async (vLLM 0.34 added them): nothing to compose",
        allow_module_level=True,
    )

from vllm.config.kv_transfer import KVCacheAccess  # noqa: E402
from vllm_harness import builtin_config, make_connector, make_request, make_scheduler  # noqa: E402

from multiconnector.errors import DuplicateConnectorError, InvalidValueError  # noqa: E402
from multiconnector.vllm import MultiConnector  # noqa: E402
from multiconnector.vllm.errors import ChildAnswerError  # noqa: E402

pytestmark = pytest.mark.vllm

HERE = __name__  # vLLM's factory imports the test children below from this module

R, EF, FD, IPC = (
    KVCacheAccess.REGISTERS,
    KVCacheAccess.EXPORTS_FABRIC,
    KVCacheAccess.EXPORTS_FD,
    KVCacheAccess.LEGACY_IPC,
)
NONE = KVCacheAccess.IN_PROCESS


class LMCacheStyleConnector(ExampleConnector):  # type: ignore[misc]
    """Answers ``kv_cache_access`` as LMCache's own ``LMCacheMPConnector`` does: with its VMM
    API (``lmcache.mp.use_vmm_api``) the LMCache server imports the cache through POSIX file
    descriptors (``EXPORTS_FD``); without it, through legacy CUDA IPC (``LEGACY_IPC``, vLLM's
    built-in class's answer)."""

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: Any) -> KVCacheAccess:
        if kv_transfer_config.get_from_extra_config("lmcache.mp.use_vmm_api", False):
            return FD
        return IPC


class AsyncTierConnector(ExampleConnector):  # type: ignore[misc]
    """A cache tier that says whether it loads asynchronously (``loads_async``) and supports
    lookahead block hashes (``lookahead``), whatever the request's P/D params."""

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: Any) -> bool:
        return bool(kv_transfer_config.get_from_extra_config("lookahead", True))

    def may_load_async(self, request: Any) -> bool:
        return bool(self._kv_transfer_config.get_from_extra_config("loads_async", True))


class MisbehavingConnector(ExampleConnector):  # type: ignore[misc]
    """In the hook its extra config's ``misbehave_in`` names, raises (``misbehave``:
    ``"raise"``) or answers ``misbehave`` as it is (garbage); the other hooks answer sanely."""

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: Any) -> Any:
        return _misbehave(kv_transfer_config, "kv_cache_access", R)

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: Any) -> Any:
        return _misbehave(kv_transfer_config, "supports_lookahead_block_hashes", True)

    def may_load_async(self, request: Any) -> Any:
        return _misbehave(self._kv_transfer_config, "may_load_async", True)


def _misbehave(kv_transfer_config: Any, hook: str, healthy: Any) -> Any:
    if kv_transfer_config.get_from_extra_config("misbehave_in", None) != hook:
        return healthy
    how = kv_transfer_config.get_from_extra_config("misbehave", None)
    if how == "raise":
        raise RuntimeError("the child's hook raised")
    return how


# -- the children of the table ------------------------------------------------------------------


def nixl(device: str = "cuda", mode: str | None = None) -> dict[str, Any]:
    extra = {} if mode is None else {"transfer_mode": mode}
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": device,
        "kv_connector_extra_config": extra,
    }


def example() -> dict[str, Any]:
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": "local_storage"},
    }


def offloading() -> dict[str, Any]:
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"block_size": 32, "cpu_bytes_to_use": 1 << 20},
    }


def ours_child(kv_connector: str, **extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": kv_connector,
        "kv_connector_module_path": HERE,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": "local_storage", **extra},
    }


def lmcache(vmm: bool) -> dict[str, Any]:
    return ours_child("LMCacheStyleConnector", **{"lmcache.mp.use_vmm_api": vmm})


def tier(*, loads_async: bool = True, lookahead: bool = True) -> dict[str, Any]:
    return ours_child("AsyncTierConnector", loads_async=loads_async, lookahead=lookahead)


def role(child: dict[str, Any], value: str) -> dict[str, Any]:
    """``child`` with our ``multiconnector_role`` (vLLM's class passes it on, ignored)."""
    extra = {**child.get("kv_connector_extra_config", {}), "multiconnector_role": value}
    return {**child, "kv_connector_extra_config": extra}


def transfer(children: list[dict[str, Any]], *, ours: bool) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="MultiConnector",
        kv_connector_module_path="multiconnector.vllm" if ours else None,
        kv_role="kv_both",
        engine_id="engine-0",
        kv_connector_extra_config={"connectors": children},
    )


@pytest.fixture(autouse=True)
def _storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # ExampleConnector's relative shared_storage_path


# -- the class-level hooks: the table ------------------------------------------------------------

#: ``(children, kv_cache_access, supports_lookahead_block_hashes)``, by id: what both classes
#: answer.
CLASS_TABLE: dict[str, tuple[list[dict[str, Any]], KVCacheAccess, bool]] = {
    "nixl-device-buffer": ([nixl("cuda")], R | EF, True),
    "nixl-cpu-buffer": ([nixl("cpu")], NONE, True),
    "nixl-push": ([nixl("cuda", "push")], R | EF, True),
    "nixl-pull": ([nixl("cuda", "pull")], R | EF, True),
    "nixl-push-cpu-buffer": ([nixl("cpu", "push")], NONE, True),
    "example": ([example()], NONE, False),
    "offloading": ([offloading()], NONE, True),
    "lmcache-vmm": ([lmcache(vmm=True)], FD, False),
    "lmcache-ipc": ([lmcache(vmm=False)], IPC, False),
    "nixl-and-offloading": ([nixl("cuda"), offloading()], R | EF, True),
    "nixl-cpu-and-lmcache-vmm": ([nixl("cpu"), lmcache(vmm=True)], FD, False),
    "nixl-example-lmcache": ([nixl("cuda"), example(), lmcache(vmm=True)], R | EF | FD, False),
    "offloading-and-tier": ([offloading(), tier()], NONE, True),
    "tier-without-lookahead": ([offloading(), tier(lookahead=False)], NONE, False),
    "save-only-nixl-load-only-offloading": (
        [role(nixl("cuda"), "save"), role(offloading(), "load")],
        R | EF,
        True,
    ),
    "load-only-nixl-save-only-lmcache": (
        [role(nixl("cuda", "pull"), "load"), role(lmcache(vmm=False), "save")],
        R | EF | IPC,
        False,
    ),
    "save-only-example": ([role(example(), "save"), offloading()], NONE, False),
}


@pytest.mark.parametrize("case", list(CLASS_TABLE))
def test_kv_cache_access_reaches_vllm_as_vllms_class_answers(case: str) -> None:
    """Asked the way vLLM asks it (the config's own ``kv_cache_access()``, through the factory,
    as the extensible KV cache does): every child's flags, whatever its role."""
    children, expected, _ = CLASS_TABLE[case]
    ours, theirs = transfer(children, ours=True), transfer(children, ours=False)
    assert KVConnectorFactory.get_connector_class(ours) is MultiConnector
    assert KVConnectorFactory.get_connector_class(theirs) is VllmMultiConnector
    answer = ours.kv_cache_access()
    assert answer == theirs.kv_cache_access() == expected
    assert isinstance(answer, KVCacheAccess)
    assert ours.registers_kv_cache_memory() == theirs.registers_kv_cache_memory()


@pytest.mark.parametrize("case", list(CLASS_TABLE))
def test_lookahead_block_hashes_as_vllms_class_answers(case: str) -> None:
    children, _, expected = CLASS_TABLE[case]
    ours, theirs = transfer(children, ours=True), transfer(children, ours=False)
    answers = [
        KVConnectorFactory.get_connector_class(config).supports_lookahead_block_hashes(config)
        for config in (ours, theirs)
    ]
    assert answers == [expected, expected]


@pytest.mark.parametrize(
    ("case", "imex", "enabled"),
    [
        ("nixl-device-buffer", False, False),
        ("nixl-device-buffer", True, True),
        ("nixl-cpu-buffer", False, True),
        ("lmcache-ipc", True, False),
        ("lmcache-vmm", False, True),
        ("offloading", False, True),
    ],
)
def test_the_kv_cache_vllm_lays_out_on_a_cuda_machine_is_the_same(
    case: str, imex: bool, enabled: bool, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's own decision of the extensible KV cache (``VllmConfig``), with the platform
    answering as a CUDA machine with or without an IMEX channel: the same for both classes.
    Under the base class's default (what ours answered before), NIXL on a device buffer
    without IMEX would get the extensible cache, whose memory NIXL's peers on the host cannot
    map, and LMCache's legacy IPC a cache it cannot share."""
    from vllm.platforms import current_platform  # noqa: PLC0415

    monkeypatch.setattr(current_platform, "is_cuda_alike", lambda: True)
    monkeypatch.setattr(current_platform, "is_rocm", lambda: False)
    monkeypatch.setattr("vllm.utils.vmm_driver.imex_channel_available", lambda: imex)
    decided = []
    for ours in (True, False):
        config = builtin_config(model, CLASS_TABLE[case][0], ours=ours)
        config.cache_config._extensible_kv_cache_resolved = False
        config.cache_config.enable_extensible_kv_cache = None
        config._resolve_extensible_kv_cache()
        decided.append(config.cache_config.enable_extensible_kv_cache)
    assert decided == [enabled, enabled]


# -- may_load_async: the table -------------------------------------------------------------------

PLAIN, PD = "plain", "p/d"

#: ``(children, children vLLM's class answers the same with, plain answer, P/D answer)``: a
#: request without transfer params, and one a P/D decode side loads (``do_remote_prefill``).
#: Without roles, vLLM's class is asked on the same children.
LOAD_TABLE: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool, bool]] = {
    "nixl": ([nixl("cpu")], None, False, True),
    "nixl-push": ([nixl("cpu", "push")], None, False, True),
    "example": ([example()], None, False, True),
    "offloading": ([offloading()], None, False, True),
    "async-tier": ([tier()], None, True, True),
    "tier-that-never-loads-async": ([tier(loads_async=False)], None, False, False),
    "nixl-and-async-tier": ([nixl("cpu"), tier()], None, True, True),
    "quiet-tier-and-nixl": ([tier(loads_async=False), nixl("cpu")], None, False, True),
    "quiet-tier-and-offloading": ([tier(loads_async=False), offloading()], None, False, True),
    "load-only-tier-save-only-nixl": (
        [role(tier(), "load"), role(nixl("cpu"), "save")],
        [tier()],
        True,
        True,
    ),
    # A save-only child is never looked up: it cannot load, so it is not asked.
    "save-only-tier-and-nixl": ([role(tier(), "save"), nixl("cpu")], [nixl("cpu")], False, True),
    "save-only-nixl-and-quiet-tier": (
        [role(nixl("cpu"), "save"), tier(loads_async=False)],
        [tier(loads_async=False)],
        False,
        False,
    ),
}


def requests() -> dict[str, Any]:
    plain, pd = make_request("plain"), make_request("pd")
    pd.kv_transfer_params = {"do_remote_prefill": True, "remote_engine_id": "prefill-0"}
    return {PLAIN: plain, PD: pd}


def load_answers(model: Path, children: list[dict[str, Any]], *, ours: bool) -> dict[str, bool]:
    built = make_connector(builtin_config(model, children, ours=ours), KVConnectorRole.SCHEDULER)
    answers = {}
    for kind, request in requests().items():
        built.on_new_request(request)  # vLLM 0.34 calls it before the request is queued
        answers[kind] = built.may_load_async(request)
    return answers


@pytest.mark.parametrize("case", list(LOAD_TABLE))
def test_may_load_async_as_vllms_class_answers(case: str, model: Path) -> None:
    children, theirs_children, plain, pd = LOAD_TABLE[case]
    ours = load_answers(model, children, ours=True)
    theirs = load_answers(
        model, children if theirs_children is None else theirs_children, ours=False
    )
    assert ours == theirs == {PLAIN: plain, PD: pd}


@pytest.mark.parametrize(("case", "queued"), [("async-tier", True), ("nixl", False)])
def test_the_scheduler_queues_a_request_for_an_async_load_as_under_vllms_class(
    case: str, queued: bool, model: Path
) -> None:
    """The real ``Scheduler`` with ``--max-num-inflight-kv-loads``: a request a child may load
    asynchronously waits in the in-flight load queue, under either class."""
    for ours in (True, False):
        config = builtin_config(model, LOAD_TABLE[case][0], ours=ours)
        config.scheduler_config.max_num_inflight_kv_loads = 2
        scheduler = make_scheduler(config)
        request = make_request(f"r-{ours}")
        scheduler.add_request(request)
        assert (request in scheduler.async_kv_waiting) is queued
        assert (request in scheduler.waiting) is not queued


# -- a child that raises or answers garbage ------------------------------------------------------


def misbehaving(hook: str, how: Any) -> dict[str, Any]:
    return ours_child(
        "MisbehavingConnector", misbehave_in=hook, misbehave=how, multiconnector_name="bad"
    )


@pytest.mark.parametrize("how", ["raise", "REGISTERS", True, None.__class__, 1 << 12, -1, 1.0])
def test_a_child_whose_access_is_unknown_stops_the_start_naming_it(how: Any) -> None:
    """No guess is safe for the cache's layout: the configuration is refused, naming the
    child and the hook, through vLLM's own call (``KVTransferConfig.kv_cache_access``)."""
    config = transfer([nixl("cuda"), misbehaving("kv_cache_access", how)], ours=True)
    with pytest.raises(ChildAnswerError, match=r"'bad': kv_cache_access: ") as caught:
        config.kv_cache_access()
    assert (caught.value.name, caught.value.hook) == ("bad", "kv_cache_access")
    if how == "raise":
        assert isinstance(caught.value.__cause__, RuntimeError)


def test_an_int_access_made_of_known_flags_is_taken_as_vllms_class_takes_it() -> None:
    children = [nixl("cpu"), misbehaving("kv_cache_access", int(R | FD))]
    ours, theirs = transfer(children, ours=True), transfer(children, ours=False)
    assert ours.kv_cache_access() == theirs.kv_cache_access() == R | FD


@pytest.mark.parametrize("how", ["raise", "yes", 1, None.__class__])
def test_a_child_whose_lookahead_is_unknown_turns_lookahead_off_logged(
    how: Any, caplog: pytest.LogCaptureFixture
) -> None:
    config = transfer(
        [offloading(), misbehaving("supports_lookahead_block_hashes", how)], ours=True
    )
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        assert MultiConnector.supports_lookahead_block_hashes(config) is False
    warned = [r.getMessage() for r in caplog.records if r.name == "multiconnector"]
    assert len(warned) == 1
    assert "'bad'" in warned[0] and "lookahead block hashing off" in warned[0]


@pytest.mark.parametrize("how", ["raise", "yes", 1])
@pytest.mark.parametrize(("other", "expected"), [(False, {PLAIN: False, PD: True}), (True, None)])
def test_a_child_whose_may_load_async_fails_is_counted_and_the_default_stands(
    how: Any, other: bool, expected: dict[str, bool] | None, model: Path
) -> None:
    """The failing child's answer becomes the base class's default (the P/D flag), as for a
    child without the hook; another child's ``True`` still answers. Counted per request."""
    children = [misbehaving("may_load_async", how), tier(loads_async=other)]
    built = make_connector(builtin_config(model, children, ours=True), KVConnectorRole.SCHEDULER)
    answers = {kind: built.may_load_async(request) for kind, request in requests().items()}
    assert answers == (expected or {PLAIN: True, PD: True})
    assert built.child_failures() == {"bad": {"may_load_async": 2}}


def test_vllms_class_lets_a_childs_may_load_async_exception_reach_the_scheduler(
    model: Path,
) -> None:
    """The contrast (docs/vllm.md's failure table): vLLM's class raises where ours answers."""
    children = [misbehaving("may_load_async", "raise"), tier(loads_async=False)]
    built = make_connector(builtin_config(model, children, ours=False), KVConnectorRole.SCHEDULER)
    with pytest.raises(RuntimeError, match="the child's hook raised"):
        built.may_load_async(requests()[PD])


@pytest.mark.parametrize(
    ("children", "error"),
    [
        ([], InvalidValueError),
        (
            [
                example(),
                example()
                | {"kv_connector_extra_config": {"multiconnector_name": "ExampleConnector"}},
            ],
            DuplicateConnectorError,
        ),
    ],
    ids=["no-children", "a-name-twice"],
)
def test_a_configuration_ours_refuses_is_refused_by_name_when_built(
    children: list[dict[str, Any]], error: type[Exception], model: Path
) -> None:
    """vLLM 0.34 asks the class-level hooks while it validates its config (where its validator
    would wrap our error in its own): such a configuration answers as the base class does, and
    ours refuses it, with its own error, when vLLM builds the connector."""
    config = transfer(children, ours=True)
    assert config.kv_cache_access() == NONE
    assert MultiConnector.supports_lookahead_block_hashes(config) is False
    with pytest.raises(error):
        make_connector(builtin_config(model, children, ours=True), KVConnectorRole.SCHEDULER)
