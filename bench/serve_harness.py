"""``vllm serve`` on the tiny model, as an operator runs it, and plain HTTP clients for it.

The served engine test (``tests/engine/test_serve.py``) and the served row of ``make bench``
(``bench/serve_row.py``) start the engine environment's own ``vllm`` command on the tiny random
Llama of ``bench.engine_harness``, with a byte-level BPE tokenizer trained here on the project's
own documentation (the ``tokenizers`` package; nothing is downloaded), bound to 127.0.0.1 on a
free port and to one core. The clients are the standard library's (``http.client``), each call
with a time limit.

A :class:`Server` always ends its process group on exit, whatever happened.
"""

# vLLM and tokenizers are imported inside functions: the main environment collects the tests.
# ruff: noqa: PLC0415

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from . import engine_harness as h

#: The tiny Llama's vocabulary: the tokenizer is trained to exactly this many ids.
VOCAB = 1024
#: Ids 0, 1, 2: the tiny Llama's config names 1 and 2 its BOS and EOS.
SPECIAL = ("<unk>", "<s>", "</s>")
#: How long a server may take to answer ``/health`` after it started (about 100 s at a load
#: average of 2 on the project's 2-core machine: each process imports vLLM).
START_TIMEOUT = 420.0
#: Above the prompt tokens of ``vllm bench serve``'s 64 prompts of 128 arriving at once: no
#: prefill is chunked (vLLM's ExampleConnector saves a chunked prefill's first chunk under the
#: whole prompt; docs/vllm.md, *Upstream limits*).
BATCHED_TOKENS = 16384
#: How long one HTTP call may take.
CALL_TIMEOUT = 120.0


def write_tokenizer(folder: Path) -> Path:
    """Train a byte-level BPE tokenizer of :data:`VOCAB` ids on the repository's Markdown and
    save it into ``folder`` (``tokenizer.json`` and its config), beside the model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [p.read_text(encoding="utf-8") for p in sorted(h.REPO.glob("**/*.md"))[:40]]
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    assert tokenizer.get_vocab_size() <= VOCAB, tokenizer.get_vocab_size()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token=SPECIAL[0],
        bos_token=SPECIAL[1],
        eos_token=SPECIAL[2],
        model_max_length=h.MAX_MODEL_LEN,
    )
    fast.save_pretrained(folder)
    return folder


def write_served_model(folder: Path) -> Path:
    """The tiny Llama with its tokenizer, in ``folder``: what ``vllm serve`` is given."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h.write_tiny_llama(folder)
        write_tokenizer(folder)
    return folder


def children(storage: Path) -> list[dict[str, Any]]:
    """Two of vLLM's own ``ExampleConnector`` children (loaded from vLLM), as the issue ran."""
    return [
        {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(storage / name)},
        }
        for name in ("a", "b")
    ]


def transfer(side: str, storage: Path) -> dict[str, Any] | None:
    """The KV transfer config of ``side``: ``none``, ``vllm`` (vLLM's class) or ``ours``."""
    if side == "none":
        return None
    return h.multi_config(children(storage), ours=side == "ours")


def vllm_command() -> Path:
    """The engine environment's ``vllm`` command, beside its Python."""
    return Path(sys.executable).parent / "vllm"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve_command(model: Path, port: int, config: dict[str, Any] | None) -> list[str]:
    """``vllm serve`` on the tiny model with the engine tests' settings."""
    command = [str(vllm_command()), "serve", str(model), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--dtype", "float32", "--enforce-eager", "--seed", "0"]
    command += ["--block-size", str(h.BLOCK_SIZE), "--max-model-len", str(h.MAX_MODEL_LEN)]
    command += ["--max-num-batched-tokens", str(BATCHED_TOKENS), "--max-num-seqs", "128"]
    command += ["--served-model-name", "tiny", "--enable-prompt-tokens-details"]
    # The worker in the engine core's process (one GPU's worth, as vLLM does on one device
    # without multiprocessing): one process fewer to start, the same two connector roles.
    command += ["--disable-uvicorn-access-log", "--distributed-executor-backend", "uni"]
    # A graceful stop: the engine core gets time to shut its executor and scheduler down (and
    # with them both connectors); vLLM's default, 0, kills it at once.
    command += ["--shutdown-timeout", "20"]
    if config is not None:
        command += ["--kv-transfer-config", json.dumps(config)]
    return command


def serve_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: the engine tests' (one core, offline, this repository first on
    ``PYTHONPATH``), at vLLM's default log level, with the development endpoints on (for
    ``/reset_prefix_cache``)."""
    env = dict(os.environ)
    env.update(h.ENGINE_ENV)
    env["VLLM_LOGGING_LEVEL"] = "INFO"
    env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("MULTICONNECTOR_SERVE_BIND", "0")
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["DO_NOT_TRACK"] = "1"
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(h.REPO), *(p for p in paths if p != str(h.REPO))])
    env.update(extra or {})
    return env


def debug_logging_config(folder: Path) -> Path:
    """A logging config for ``VLLM_LOGGING_CONFIG_PATH``: vLLM's own default (its format, its
    stream, INFO), plus the ``multiconnector`` logger at DEBUG through a handler of the same
    format; so the adapter's debug lines (the books at shutdown) reach the server's log."""
    import copy

    from vllm.logger import DEFAULT_LOGGING_CONFIG

    config = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
    config["handlers"]["vllm"].update(level="INFO", formatter="vllm")
    config["loggers"]["vllm"]["level"] = "INFO"
    for formatter in config["formatters"].values():
        formatter["log_level"] = "INFO"
    config["handlers"]["multiconnector"] = {**config["handlers"]["vllm"], "level": "DEBUG"}
    config["loggers"]["multiconnector"] = {
        "handlers": ["multiconnector"],
        "level": "DEBUG",
        "propagate": False,
    }
    path = folder / "logging.json"
    path.write_text(json.dumps(config, indent=1))
    return path


class ServerDied(RuntimeError):
    """The server exited, or did not answer ``/health`` in time; the log's tail says why."""


class Server:
    """``vllm serve`` as a subprocess (its own process group), its output in ``log``.

    ``with Server(...) as server:`` waits (bounded) until ``/health`` answers; leaving the block
    stops the server with SIGTERM (the engine then shuts its connectors down), and kills the
    whole group if it is still there after ``grace`` seconds.
    """

    def __init__(
        self,
        model: Path,
        config: dict[str, Any] | None,
        log: Path,
        env: dict[str, str] | None = None,
        grace: float = 30.0,
    ) -> None:
        self.port = free_port()
        self.command = serve_command(model, self.port, config)
        self.env = serve_environment(env)
        self.log = log
        self.grace = grace
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def __enter__(self) -> Server:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.log.parent,
                start_new_session=True,
            )
        self.started = time.monotonic()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> float:
        """Wait until ``/health`` answers 200; the seconds since the start."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerDied(f"the server exited ({self.process.returncode}):\n{self.tail()}")
            try:
                if self.get("/health", timeout=5.0)[0] == 200:
                    return time.monotonic() - self.started
            except OSError:
                pass
            time.sleep(0.5)
        raise ServerDied(f"no answer on /health within {timeout:.0f} s:\n{self.tail()}")

    def stop(self) -> int | None:
        """SIGTERM to the server's process, as a service manager stops it (it shuts its engine
        down), then the group killed after :attr:`grace` s; the server's exit status."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            try:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=self.grace)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # what is left: the engine core, its workers
        try:
            return process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    # -- HTTP --------------------------------------------------------------------------------------

    def connection(self, timeout: float = CALL_TIMEOUT) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def get(self, path: str, timeout: float = CALL_TIMEOUT) -> tuple[int, str]:
        connection = self.connection(timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode("utf-8", "replace")
        finally:
            connection.close()

    def post(
        self, path: str, body: dict[str, Any] | None = None, timeout: float = CALL_TIMEOUT
    ) -> tuple[int, Any]:
        """POST ``body`` as JSON; the status and the decoded answer (its text if not JSON)."""
        connection = self.connection(timeout)
        try:
            data = json.dumps(body or {}).encode()
            connection.request("POST", path, data, {"Content-Type": "application/json"})
            response = connection.getresponse()
            text = response.read().decode("utf-8", "replace")
        finally:
            connection.close()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text

    def complete(
        self, prompt: str | Sequence[int], max_tokens: int, **extra: Any
    ) -> tuple[int, Any]:
        """One greedy, non-streamed completion; the status and the answer."""
        body = completion_body(prompt, max_tokens, **extra)
        return self.post("/v1/completions", body)

    def stream_and_drop(self, prompt: str | Sequence[int], max_tokens: int, chunks: int) -> int:
        """Stream a completion, read ``chunks`` events, then drop the connection; the events
        read (fewer if the stream ended first)."""
        body = completion_body(prompt, max_tokens, stream=True)
        connection = self.connection()
        try:
            headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
            connection.request("POST", "/v1/completions", json.dumps(body).encode(), headers)
            response = connection.getresponse()
            assert response.status == 200, response.read()
            read = 0
            for line in _lines(response):
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    read += 1
                    if read >= chunks:
                        break
            return read
        finally:
            connection.close()  # mid-stream: the server sees the client go

    def metrics(self) -> dict[str, float]:
        """``/metrics``: each sample without labels' braces, summed over label sets."""
        status, text = self.get("/metrics")
        assert status == 200, text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            name = name.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(value)
        return values


def completion_body(prompt: str | Sequence[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        **extra,
    }


def _lines(response: http.client.HTTPResponse) -> Iterator[bytes]:
    while True:
        line = response.readline()
        if not line:
            return
        line = line.strip()
        if line:
            yield line


def cached_tokens(answer: dict[str, Any]) -> int:
    """A completion's cached prompt tokens (``--enable-prompt-tokens-details``)."""
    details = answer.get("usage", {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


#: ``vllm bench serve``'s time limit.
BENCH_TIMEOUT = 600.0


def bench_serve(
    server: Server,
    model: Path,
    folder: Path,
    *,
    num_prompts: int = 64,
    input_len: int = 128,
    output_len: int = 128,
    seed: int = 1,
) -> dict[str, Any]:
    """``vllm bench serve --dataset-name random`` against ``server``; its saved result. Its
    output goes to ``folder/bench.log``."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [str(vllm_command()), "bench", "serve", "--backend", "openai"]
    command += ["--base-url", f"http://127.0.0.1:{server.port}", "--model", "tiny"]
    command += ["--tokenizer", str(model), "--dataset-name", "random"]
    command += ["--random-input-len", str(input_len), "--random-output-len", str(output_len)]
    command += ["--num-prompts", str(num_prompts), "--seed", str(seed), "--ignore-eos"]
    command += ["--ready-check-timeout-sec", "60", "--disable-tqdm", "--save-result"]
    command += ["--result-dir", str(folder), "--result-filename", "result.json"]
    env = serve_environment()
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    with (folder / "bench.log").open("wb") as out:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=folder,
            timeout=BENCH_TIMEOUT,
            check=False,
        )
    log = (folder / "bench.log").read_text(errors="replace")
    assert done.returncode == 0, log[-4000:]
    result: dict[str, Any] = json.loads((folder / "result.json").read_text())
    return result
