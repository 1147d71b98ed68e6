"""What a prefill engine over NIXL does while idle and while it holds KV nobody has pulled yet.

For vLLM's ``MultiConnector`` and ours (the P/D config of ``bench.pd_harness``: NixlConnector
over the CPU plus ExampleConnector), one prefill server alone, on one core (and, for the idle
phase only, ours over ExampleConnector alone and no connector: what NIXL adds):

1. idle: the CPU its process group burns over ``--window`` seconds with no request;
2. holding: ``--held`` prompts prefilled with ``do_remote_decode`` (one token each) and never
   pulled, so NixlConnector holds their KV until its lease expires: the CPU, the engine steps
   (counted by ExampleConnector's "attn_metadata is None" warning, logged once per step in which
   the worker runs no forward pass) and the steps per second, until the lease expired;
3. idle again, after the expiry.

Run in .venv-engine with NIXL (``make nixl``)::

    .venv-engine/bin/python -m bench.pd_idle --json build/pd_idle.json

It prints one row per configuration and phase, with the threads that used 2 % of a core or more
(name, the cores they may run on, their share); the figures quoted in docs/vllm.md come from it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import bench.engine_harness as h
import bench.pd_harness as pd
from bench.pd_proxy import REMOTE_DECODE

STEP_LINE = "attn_metadata is None"


def _cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU seconds of these processes (gone ones count 0)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def _threads(pids: list[int]) -> dict[tuple[int, int], tuple[str, float, str]]:
    """Per (pid, thread id): its name, CPU seconds so far and the cores it may run on."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                base = Path(f"/proc/{pid}/task/{tid}")
                fields = (base / "stat").read_text().rsplit(")", 1)[1].split()
                cores = ",".join(map(str, sorted(os.sched_getaffinity(tid))))
                name = (base / "comm").read_text().strip()
            except OSError:
                continue
            found[(pid, tid)] = (name, (int(fields[11]) + int(fields[12])) / ticks, cores)
    return found


def _busiest(
    before: dict[tuple[int, int], tuple[str, float, str]],
    after: dict[tuple[int, int], tuple[str, float, str]],
    elapsed: float,
) -> list[str]:
    """The threads that used at least 2 % of a core between the two samples, busiest first:
    ``name@cores: share``."""
    rows = []
    for key, (name, cpu, cores) in after.items():
        share = (cpu - before.get(key, (name, 0.0, cores))[1]) / elapsed
        if share >= 0.02:
            rows.append((share, f"{name}@{cores}: {share:.2f}"))
    return [text for _, text in sorted(rows, reverse=True)]


def _steps(log: Path) -> int:
    return log.read_text(errors="replace").count(STEP_LINE)


def _phase(server: pd.Server, seconds: float) -> dict[str, float | list[str]]:
    """CPU (cores) and logged no-forward steps over ``seconds`` from now."""
    pids = server.pids()
    threads = _threads(pids)
    cpu, steps, start = _cpu_seconds(pids), _steps(server.log), time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - start
    return {
        "seconds": round(elapsed, 1),
        "cores": round((_cpu_seconds(pids) - cpu) / elapsed, 2),
        "steps_per_second": round((_steps(server.log) - steps) / elapsed, 1),
        "threads": _busiest(threads, _threads(pids), elapsed),
    }


#: The configurations: vLLM's MultiConnector and ours over NIXL and ExampleConnector; the same
#: without NIXL (ours over ExampleConnector alone); no connector at all.
CONFIGS = ("vllm", "ours", "example", "none")


def _config(label: str, folder: Path, lease: int) -> dict[str, Any] | None:
    if label in ("vllm", "ours"):
        return pd.pd_config(folder / "kv", label == "ours", lease)
    if label == "example":
        config = pd.pd_config(folder / "kv", True, lease)
        del config["kv_connector_extra_config"]["connectors"][0]  # NixlConnector
        return config
    return None


def measure(label: str, model: Path, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    config = _config(label, folder, args.lease)
    server = pd.Server(f"prefill-{label}", model, folder, core=0, transfer=config)
    try:
        server.wait_ready(600)
        time.sleep(5)  # the start's own work settles
        row: dict[str, Any] = {"idle": _phase(server, args.window)}
        if label not in ("vllm", "ours"):
            return row  # nothing to hold without NIXL
        prompts = h.prompts(args.held, 100, seed=7)
        for prompt in prompts:
            body = pd.completion(prompt, 1, kv_transfer_params=dict(REMOTE_DECODE))
            pd.post(server.url + "/v1/completions", body)
        row["holding"] = _phase(server, args.lease * 0.8)
        expired = "vllm:nixl_num_kv_expired_reqs_total"
        deadline = time.monotonic() + args.lease + 60
        while pd.metrics(server.url).get(expired, 0) < args.held and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2)
        row["after"] = _phase(server, args.window)
        row["expired"] = pd.metrics(server.url).get(expired, 0)
        return row
    finally:
        server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=float, default=10.0, help="seconds per idle phase")
    parser.add_argument("--held", type=int, default=4, help="prompts held, never pulled")
    parser.add_argument("--lease", type=int, default=20, help="NixlConnector's lease (s)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="of " + ",".join(CONFIGS))
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args()
    h.engine_environment(in_process=False)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        model.mkdir()
        h.write_tiny_llama(model)
        pd.write_tokenizer(model)
        for label in args.configs.split(","):
            folder = Path(tmp) / label
            folder.mkdir()
            results[label] = measure(label, model, folder, args)
            for phase in ("idle", "holding", "after"):
                if phase in results[label]:
                    print(label, phase, json.dumps(results[label][phase]), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
