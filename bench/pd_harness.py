"""Prefill and decode as two served engines, with the KV moved between them over NIXL.

Each engine is vLLM's OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``)
on ``127.0.0.1``, on the tiny random Llama of ``bench.engine_harness`` with a byte-level BPE
tokenizer trained here (the server needs one; nothing is downloaded), pinned to one core
(``VLLM_CPU_OMP_THREADS_BIND``). Their KV transfer config is a ``MultiConnector`` (vLLM's or
ours) over ``NixlConnector`` (``kv_buffer_device: "cpu"``) and ``ExampleConnector``: a P/D
transport with a cache tier. ``bench.pd_proxy`` sends each prompt to the prefill engine, then to
the decode engine with what the prefill engine answered.

Only the standard library and ``tokenizers``/``transformers`` here: the servers run vLLM in their
own processes.
"""

# transformers and tokenizers are imported inside functions: the main environment collects the
# engine tests and has neither.
# ruff: noqa: PLC0415

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.engine_harness import BLOCK_SIZE, ENGINE_ENV, MAX_BATCHED_TOKENS, MAX_MODEL_LEN, REPO

#: What every serving engine needs on top of ``ENGINE_ENV``: UCX over TCP and shared memory (no
#: InfiniBand, no GPU here), logs at INFO (the servers' logs are read for the NIXL handshake).
SERVE_ENV = {
    **ENGINE_ENV,
    "UCX_TLS": "tcp,sm,self",
    "VLLM_LOGGING_LEVEL": "INFO",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
    "PYTHONUNBUFFERED": "1",
}


def write_tokenizer(folder: Path, vocab_size: int = 1024) -> Path:
    """Train a byte-level BPE tokenizer of ``vocab_size`` ids on made-up text; save it into
    ``folder`` (beside the model: ``tokenizer.json``, ``tokenizer_config.json``)."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5)) for _ in range(400)
    ]
    text = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(400)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],  # ids 0, 1, 2: the model's bos 1 and eos 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(text, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(folder)
    return folder


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child(kind: str, **extra: Any) -> dict[str, Any]:
    """One child's entry: ``"nixl"`` (NixlConnector, its buffer on the CPU) or ``"example"``
    (ExampleConnector; ``shared_storage_path`` in ``extra``)."""
    if kind == "nixl":
        return {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": dict(extra),
    }


def pd_config(storage: Path, ours: bool, lease: int | None = None) -> dict[str, Any]:
    """The transfer config of one side: a MultiConnector (ours, or vLLM's) over NixlConnector and
    ExampleConnector (saving into ``storage``); ``lease``: NixlConnector's ``kv_lease_duration``
    (seconds a prefill engine holds KV nobody pulls)."""
    nixl = child("nixl")
    if lease is not None:
        nixl["kv_connector_extra_config"] = {"kv_lease_duration": lease}
    config: dict[str, Any] = {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cpu",
        "kv_connector_extra_config": {
            "connectors": [nixl, child("example", shared_storage_path=str(storage))]
        },
    }
    if ours:
        config["kv_connector_module_path"] = "multiconnector.vllm"
    return config


def serve_command(
    model: Path, port: int, transfer: dict[str, Any] | None, hf_overrides: dict[str, Any] | None
) -> list[str]:
    """The command of one served engine on the tiny model (the same engine options as
    ``bench.engine_harness.make_llm``)."""
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--block-size",
        str(BLOCK_SIZE),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-batched-tokens",
        str(MAX_BATCHED_TOKENS),
        "--max-num-seqs",
        "16",
        "--seed",
        "0",
        "--served-model-name",
        "tiny",
        "--disable-uvicorn-access-log",
    ]
    if transfer is not None:
        command += ["--kv-transfer-config", json.dumps(transfer)]
    if hf_overrides is not None:
        command += ["--hf-overrides", json.dumps(hf_overrides)]
    return command


class Server:
    """One served engine: its process (a session of its own), its log, its URL."""

    def __init__(
        self,
        name: str,
        model: Path,
        logs: Path,
        *,
        core: int,
        transfer: dict[str, Any] | None,
        hf_overrides: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.port = free_port()
        self.side_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = logs / f"{name}.log"
        environment = {**os.environ, **SERVE_ENV, **(env or {})}
        environment["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
        environment["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "127.0.0.1"
        environment["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(self.side_port)
        paths = [str(REPO), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
        environment["PYTHONPATH"] = os.pathsep.join(paths)
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                serve_command(model, self.port, transfer, hf_overrides),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=environment,
                cwd=str(logs),
                start_new_session=True,  # its engine core and workers die with it (killpg)
            )

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout: float) -> None:
        """Until ``/health`` answers 200; raise (with the log's tail) if it died or timed out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited {self.process.returncode}:\n{self.tail()}")
            if health(self.url):
                return
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not ready in {timeout} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 20.0) -> None:
        """Signal the server's whole process group; wait for the server (bounded)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=timeout)

    def pids(self) -> list[int]:
        """The server's process and every process of its group (engine core, workers)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) == self.process.pid:
                        found.append(int(entry.name))
                except ProcessLookupError:
                    continue
        return sorted(found)


def health(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def post(url: str, body: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """POST JSON, answer JSON (an HTTP error raises ``urllib.error.HTTPError``)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return dict(json.loads(answer.read()))


def completion(prompt: Sequence[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A greedy completion request on token ids, EOS ignored, the generated ids returned."""
    return {
        "model": "tiny",
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
        **extra,
    }


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def metrics(url: str, timeout: float = 10.0) -> dict[str, float]:
    """The server's ``/metrics``: each sample (``name{labels}``, the ``engine``/``model_name``
    labels dropped) to its value, samples of one name and labels summed."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout) as answer:
        text = answer.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        found = _SAMPLE.match(line)
        if found is None:
            continue
        name, labels, value = found.groups()
        kept = [
            part
            for part in (labels or "{}")[1:-1].split(",")
            if part and not part.startswith(("engine=", "model_name="))
        ]
        key = name + ("{" + ",".join(kept) + "}" if kept else "")
        samples[key] = samples.get(key, 0.0) + float(value)
    return samples


def model_name(url: str) -> str:
    """The served model's name (the model's path)."""
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as answer:
        return str(json.loads(answer.read())["data"][0]["id"])
