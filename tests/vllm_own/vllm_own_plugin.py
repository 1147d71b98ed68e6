"""A pytest plugin: vLLM's own ``test_multi_connector.py`` against vLLM's class or ours.

``make test-vllm-own`` runs that file, from vLLM's source package (unmodified), with ``-p
vllm_own_plugin``. ``MULTICONNECTOR_UNDER_TEST`` says which class it tests:

* ``vllm``: vLLM's own ``MultiConnector``, as shipped;
* ``ours``: :class:`multiconnector.vllm.MultiConnector`, put in place of vLLM's class in
  ``vllm.distributed.kv_transfer.kv_connector.v1.multi_connector`` before the test module
  imports it; the engine test's transfer configs get the documented
  ``kv_connector_module_path="multiconnector.vllm"`` line.

For both, the models are local (nothing can be downloaded here): ``create_vllm_config``'s
default model and the engine test's ``MODEL_NAME`` become the tiny random Llama of the engine
tests (``bench.engine_harness.write_tiny_llama``), with a word-level tokenizer written beside it
(each word one token, as the file's prompts count on: ``"Hi " * 100`` and four words fill seven
blocks of 16). The engine test runs only where an engine does (``MULTICONNECTOR_ENGINE=1``,
set for ``.venv-engine``); elsewhere it is skipped, for both classes.

For ours, the tests that check a private contract we refuse (:data:`REFUSED`, listed with the
reasons in docs/vllm.md) are marked ``xfail(strict=True)``: they must fail, and a pass would
fail the run.
"""

# vLLM is imported inside the hooks, once the engine's environment is set.
# ruff: noqa: PLC0415

from __future__ import annotations

import importlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest

UNDER_TEST = os.environ.get("MULTICONNECTOR_UNDER_TEST", "ours")
ENGINE = os.environ.get("MULTICONNECTOR_ENGINE") == "1"
TEST_MODULE = "tests.v1.kv_connector.unit.test_multi_connector"
UTILS_MODULE = "tests.v1.kv_connector.unit.utils"
OURS_PATH = "multiconnector.vllm"

#: The tests of vLLM's file that check a private contract ours refuses, with the reason
#: (docs/vllm.md, "vLLM's own tests").
REFUSED: dict[str, str] = {
    "test_cache_hit_sources_delegate_to_selected_connector": (
        "writes _requests_to_connector, vLLM's private map of request id to child index: ours "
        "routes each request by child name in its books, and an index-keyed map would have to "
        "be kept in step with them"
    ),
    "test_register_finished_partial_tail_notifies_every_connector": (
        "builds the connector with object.__new__ and sets _connectors: ours keeps its books "
        "from its constructor, which such an object never ran"
    ),
    # vLLM 0.34's file; one case of the parametrized test (its id: an empty child list).
    "test_multi_connector_children_use_configured_lookahead_hashes"
    "[child_support0-1-True-False-0-False-SCHEDULER]": (
        "configures an empty child list: ours refuses it when the connector is built, naming "
        "kv_connector_extra_config['connectors'] (a composition of nothing is a configuration "
        "mistake, and silently a connector that neither loads nor saves)"
    ),
}

#: The one test of the file that needs a real engine.
ENGINE_TESTS = frozenset({"test_multi_example_connector_consistency"})

#: Words of the file's prompts; every other id of the tiny model's vocabulary is a filler word.
WORDS = ("Hi", "Hello,", "my", "name", "is", "The", "capital", "of", "France")
SPECIAL = ("<unk>", "<s>", "</s>")
VOCAB_SIZE = 1024


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer (whitespace-split words, ``<s>`` first) for the tiny model."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    names = [*SPECIAL, *WORDS]
    names += [f"w{i}" for i in range(VOCAB_SIZE - len(names))]
    tokenizer = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 512,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def tiny_model() -> Path:
    """The tiny random Llama with its tokenizer, in a new temporary folder."""
    from bench.engine_harness import write_tiny_llama

    folder = Path(tempfile.mkdtemp(prefix="vllm-own-tiny-llama-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_tiny_llama(folder)
    write_tokenizer(folder)
    return folder


def with_our_module_path(config_class: Any) -> Any:
    """``KVTransferConfig`` with the documented line added to a ``MultiConnector`` config."""

    def make(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("kv_connector") == "MultiConnector":
            kwargs.setdefault("kv_connector_module_path", OURS_PATH)
        return config_class(*args, **kwargs)

    return make


def pytest_configure(config: pytest.Config) -> None:
    from bench.engine_harness import engine_environment

    # In-process engine: the file's own conftest (the CPU backend's block sizes) and the class
    # substitution then hold in the engine core too.
    engine_environment(in_process=True)
    model = tiny_model()
    config.stash[MODEL_KEY] = model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        utils = importlib.import_module(UTILS_MODULE)
        multi = importlib.import_module(
            "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector"
        )
    create = utils.create_vllm_config
    defaults = list(create.__defaults__)
    defaults[0] = str(model)  # create_vllm_config(model="facebook/opt-125m", ...)
    create.__defaults__ = tuple(defaults)
    if UNDER_TEST == "ours":
        from multiconnector.vllm import MultiConnector

        multi.MultiConnector = MultiConnector
    elif UNDER_TEST != "vllm":
        raise pytest.UsageError(f"MULTICONNECTOR_UNDER_TEST={UNDER_TEST!r}: 'ours' or 'vllm'")


MODEL_KEY = pytest.StashKey[Path]()


def pytest_report_header(config: pytest.Config) -> list[str]:
    import vllm

    return [
        f"vllm-own: MultiConnector under test: {UNDER_TEST}; vLLM {vllm.__version__}; "
        f"engine: {'yes' if ENGINE else 'no (the engine test is skipped)'}"
    ]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    model = config.stash[MODEL_KEY]
    for item in items:
        module = getattr(item, "module", None)
        if module is None or module.__name__ != TEST_MODULE:
            continue
        module.MODEL_NAME = str(model)
        if UNDER_TEST == "ours" and not hasattr(module.KVTransferConfig, "__wrapped_config__"):
            wrapped = with_our_module_path(module.KVTransferConfig)
            wrapped.__wrapped_config__ = module.KVTransferConfig  # type: ignore[attr-defined]
            module.KVTransferConfig = wrapped
        name = item.name.partition("[")[0]
        if name in ENGINE_TESTS and not ENGINE:
            item.add_marker(pytest.mark.skip(reason="needs a real engine: runs in .venv-engine"))
        refused = REFUSED.get(item.name, REFUSED.get(name))
        if UNDER_TEST == "ours" and refused is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=refused))
