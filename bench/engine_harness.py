"""The tiny model and the engine the engine tests (and ``bench/engine_row.py``) run.

The model is a 2-layer Llama with random weights (hidden size 256, 4 heads, 2 KV heads, a
vocabulary of 1,024: about 1.7 M parameters), written locally with ``transformers``: nothing is
downloaded. ``write_tiny_llama(folder, layers=32)`` writes the same width with 32 layers (about
19 M parameters), for the engine row where the per-layer calls weigh most; ``model_folder``
names a folder per layer count, so two models never share one. Prompts are token ids
(``skip_tokenizer_init=True``), decoding is greedy with ``ignore_eos``, in float32, with
``enforce_eager=True``.

Every ``import vllm`` is inside a function: the main environment imports this module too (the
engine tests are collected there, then deselected by their marker ``engine``).
"""

# vLLM is imported inside functions: the main environment collects this folder and has no engine.
# ruff: noqa: PLC0415

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The repository: the processes the engine spawns import ``bench.engine_children`` from it.
REPO = Path(__file__).resolve().parent.parent

#: The CPU attention backend wants a block size that is a multiple of 32.
BLOCK_SIZE = 32
#: Above every batch's prompt tokens: vLLM's ExampleConnector saves a chunked prefill's first
#: chunk under the whole prompt, and its load then fails with a shape mismatch.
MAX_BATCHED_TOKENS = 4096
MAX_MODEL_LEN = 512
#: The tiny model's layer count (``write_tiny_llama``'s default).
LAYERS = 2

#: What every engine process needs in its environment (set before vLLM is imported).
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
}


def engine_environment(in_process: bool = True, workers: int = 1) -> None:
    """Set the environment the engine reads (before it starts; vLLM reads most of it lazily)."""
    os.environ.update(ENGINE_ENV)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    if workers > 1:
        # Without it, 2 local CPU workers refuse to start ("Not enough allowed NUMA nodes").
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(workers))
    else:
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    # The processes the engine spawns import the children by module path.
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(REPO) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, paths)])


def model_folder(parent: Path, layers: int = LAYERS) -> Path:
    """Where under ``parent`` the model of ``layers`` layers is written: the tiny model's own
    name for the default, one of its own for any other count."""
    return parent / ("model" if layers == LAYERS else f"model-{layers}-layers")


def write_tiny_llama(folder: Path, layers: int = LAYERS) -> Path:
    """Write the tiny random Llama (config and float32 weights) to ``folder``; return it.
    ``layers``: its ``num_hidden_layers``, every layer of the same width."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=layers,
        vocab_size=1024,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    return folder


def prompts(count: int, length: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of ``length`` token ids each, distinct, from a fixed seed."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, 1024) for _ in range(length)] for _ in range(count)]


def example_child(
    storage: Path,
    label: str,
    record_dir: Path | None = None,
    cls: str = "RecordingExampleConnector",
    **extra: Any,
) -> dict[str, Any]:
    """One child's entry: an ExampleConnector (or a subclass from engine_children)."""
    config: dict[str, Any] = {"shared_storage_path": str(storage), "label": label, **extra}
    if record_dir is not None:
        config["record_dir"] = str(record_dir)
    return {
        "kv_connector": cls,
        "kv_connector_module_path": "bench.engine_children",
        "kv_role": "kv_both",
        "kv_connector_extra_config": config,
    }


def multi_config(children: Sequence[dict[str, Any]], ours: bool = True) -> dict[str, Any]:
    """A ``MultiConnector`` transfer config over ``children``: ours (the one added line) or
    vLLM's own."""
    config: dict[str, Any] = {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": list(children)},
    }
    if ours:
        config["kv_connector_module_path"] = "multiconnector.vllm"
    return config


def make_llm(model: Path, transfer: dict[str, Any] | None, workers: int = 1, **kwargs: Any) -> Any:
    """A fresh engine on the tiny model, with ``transfer`` as its KV transfer config."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from vllm import LLM
        from vllm.config import KVTransferConfig

    options: dict[str, Any] = {
        "model": str(model),
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "dtype": "float32",
        "block_size": BLOCK_SIZE,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_batched_tokens": MAX_BATCHED_TOKENS,
        "max_num_seqs": 128,
        "seed": 0,
        "tensor_parallel_size": workers,
        **kwargs,
    }
    if transfer is not None:
        options["kv_transfer_config"] = KVTransferConfig(**transfer)
    return LLM(**options)


def bench_llm(
    model: Path, transfer: dict[str, Any], ours: bool = True
) -> tuple[Any, dict[str, Any]]:
    """A benchmark's engine (``bench/engine_row.py``, ``bench/dead_tier_row.py``): in-process,
    the whole engine on the main thread (one torch thread, OpenMP bound to the core
    ``BENCH_ENGINE_BIND`` names, 0 by default), with ``transfer`` (``ours``: our class, else
    vLLM's); and what its process says when ready (the connector's module, the threads)."""
    engine_environment(in_process=True)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("BENCH_ENGINE_BIND", "0")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # an idle thread sleeps: no spinning
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    llm = make_llm(model, transfer)
    module = type(engine_core(llm).scheduler.connector).__module__
    assert module.startswith("multiconnector.vllm" if ours else "vllm.distributed"), module
    import torch  # vLLM imported it already, with the environment set

    torch.set_num_threads(1)  # the whole engine on the main thread: its CPU time is all
    ready = {"ready": module, "torch_threads": torch.get_num_threads()}
    ready["threads"] = threading.active_count()
    return llm, ready


def generate(llm: Any, token_prompts: Sequence[Sequence[int]], max_tokens: int) -> list[Any]:
    """Greedy generation of ``max_tokens`` per prompt (EOS ignored); the request outputs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return list(
        llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in token_prompts],
            params,
            use_tqdm=False,
        )
    )


def tokens(outputs: Sequence[Any]) -> list[list[int]]:
    """Each request's generated token ids."""
    return [list(output.outputs[0].token_ids) for output in outputs]


def cached(outputs: Sequence[Any]) -> list[int]:
    """Each request's ``num_cached_tokens``."""
    return [int(output.num_cached_tokens or 0) for output in outputs]


def loads(record_dir: Path) -> dict[str, int]:
    """Per label, how many requests the worker side loaded (engine_children's records)."""
    return {
        path.name.removesuffix(".loads"): len(path.read_text().split())
        for path in sorted(record_dir.glob("*.loads"))
    }


def engine_core(llm: Any) -> Any:
    """The in-process engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), with its scheduler."""
    return llm.llm_engine.engine_core.engine_core


def shut(llm: Any) -> None:
    """Shut the engine down and let go of vLLM's process-wide state, for the next engine."""
    import gc

    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()


def wipe(folder: Path) -> None:
    """Remove a child's storage folder."""
    shutil.rmtree(folder, ignore_errors=True)
