"""A/B of the scheduler loop row: this checkout's adapter against other versions, in one process.

Each other version is a checkout (``git worktree add``, or ``git archive REV | tar -x -C DIR``):
its ``multiconnector`` package is copied under another name (``mc_ab1``, ``mc_ab2``, ...) and
loaded by vLLM with ``kv_connector_module_path="mc_ab1.vllm"``, beside this checkout's and vLLM's
own ``MultiConnector``. All of them run the loop of ``bench/scheduler_loop.py`` (same workload,
same children, CPU time per request) interleaved, repeat after repeat, the order rotating.
Two separate runs of the row on a shared machine differ by a few percent; here every contender
sees the same load, so a change of 1 % shows::

    git archive HEAD~1 | (mkdir -p /tmp/before && tar -x -C /tmp/before)
    .venv/bin/python -m bench.ab_loop /tmp/before            # the first size
    .venv/bin/python -m bench.ab_loop --size 1 /tmp/before   # full batches

It prints, for every version, the median ratio to vLLM's and the median ratio to this
checkout's (per repeat), with interquartile ranges. ``--workload vllm-100`` (or ``vllm-1``)
runs the ``vLLM workload`` rows' steps instead (``bench/vllm_rows.py``, batches of 100 or 1),
in CPU time.
"""

from __future__ import annotations

import argparse
import gc
import random
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from . import scheduler_loop as loop_row
from . import vllm_rows
from .scheduler_parts import BLOCK, write_model


def quartiles(values: list[float]) -> str:
    low, high = loop_row.quartiles(values)
    return f"{statistics.median(values):.3f} (IQR {low:.3f}-{high:.3f})"


def rotation(labels: list[str], repeat: int) -> list[str]:
    """The order of one repeat: rotated by one place each repeat, reversed every other round, so
    that every contender runs in every position, after every other one, equally often (the one
    that runs right after vLLM's, or after another of ours, finds different caches)."""
    turn = repeat % len(labels)
    order = labels[turn:] + labels[:turn]
    return order[::-1] if (repeat // len(labels)) % 2 else order


def loop_runs(
    folder: Path, modules: dict[str, str], shape: tuple[str, int, int], requests: int
) -> dict[str, Callable[[str], float]]:
    """For vLLM's and each version: a run of the loop over fresh requests, CPU s per request."""
    model = write_model(folder / "tiny-opt")
    _, seqs, tokens = shape
    blocks = 4 * requests * ((loop_row.PROMPT + loop_row.OUTPUT) // BLOCK + 1) + 64
    loops = {"vLLM": loop_row.Loop(loop_row.config(model, False, seqs, tokens), blocks)}
    for label, module in modules.items():
        config = loop_row.config(model, True, seqs, tokens)
        config.kv_transfer_config.kv_connector_module_path = module
        loops[label] = loop_row.Loop(config, blocks)
        loaded = type(loops[label].worker).__module__
        assert loaded.startswith(module), (label, loaded)
    rng = random.Random(17)

    def runner(loop: loop_row.Loop) -> Callable[[str], float]:
        def run(tag: str) -> float:
            batch = loop_row.make_requests(tag, requests, rng)
            return loop_row.cpu_timed(loop_row._runner(loop, batch)) / requests

        return run

    return {label: runner(loop) for label, loop in loops.items()}


def workload_runs(modules: dict[str, str], batch: int) -> dict[str, Callable[[str], float]]:
    """For vLLM's and each version: steps of the vLLM workload rows, CPU s per request."""
    requests = vllm_rows.requests(batch, f"b{batch}")
    steps = 30_000 // batch
    runs: dict[str, Callable[[str], float]] = {}
    for label, module in {"vLLM": None, **modules}.items():
        through = vllm_rows.Through(module is not None, requests)
        if module is not None:  # the same, loaded from this version's package
            config = vllm_rows.config(True)
            config.kv_transfer_config.kv_connector_module_path = module
            role = KVConnectorRole
            through.scheduler = KVConnectorFactory.create_connector(config, role.SCHEDULER, None)
            through.worker = KVConnectorFactory.create_connector(config, role.WORKER, None)
            loaded = type(through.worker).__module__
            assert loaded.startswith(module), (label, loaded)
        through.step()
        assert through.sent == through.ids, label
        step = vllm_rows.steps_of(through.step, steps)

        def run(_tag: str, step: Callable[[], None] = step) -> float:
            return loop_row.cpu_timed(step) / (steps * batch)

        runs[label] = run
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("others", nargs="+", type=Path, help="checkouts to compare against")
    parser.add_argument("--size", type=int, default=0, help="0: the first size; 1: full batches")
    parser.add_argument("--repeats", type=int, default=24, help="a multiple of 2 x contenders")
    parser.add_argument(
        "--workload",
        choices=("scheduler-loop", "vllm-100", "vllm-1"),
        default="scheduler-loop",
        help="the scheduler loop row (default) or the vLLM workload rows' steps",
    )
    args = parser.parse_args()
    shape = loop_row.SHAPES[args.size]
    requests = 128 if args.workload == "scheduler-loop" else int(args.workload[5:])
    with tempfile.TemporaryDirectory() as folder:
        packages = Path(folder) / "packages"
        packages.mkdir()
        modules = {"this checkout": "multiconnector.vllm"}
        for number, other in enumerate(args.others, 1):
            source = other / "multiconnector"
            if not (source / "vllm" / "__init__.py").is_file():
                parser.error(f"{other} holds no multiconnector/vllm package")
            shutil.copytree(source, packages / f"mc_ab{number}")
            modules[str(other)] = f"mc_ab{number}.vllm"
        sys.path.insert(0, str(packages))
        if args.workload == "scheduler-loop":
            runs = loop_runs(Path(folder), modules, shape, requests)
            title = shape[0]
        else:
            runs = workload_runs(modules, requests)
            title = f"vLLM workload, batch {requests}"
        gc.collect()
        gc.freeze()
        times: dict[str, list[float]] = {label: [] for label in runs}
        labels = list(runs)
        for repeat in range(-1, args.repeats):  # repeat -1 warms up, untimed
            for label in rotation(labels, repeat):
                seconds = runs[label](f"{label}-{repeat}")
                if repeat >= 0:
                    times[label].append(seconds)
        gc.unfreeze()
    print(
        f"{title}, {args.repeats} interleaved repeats; vLLM's median: "
        f"{statistics.median(times['vLLM']) * 1e6:.2f} µs per request"
    )
    mine = times["this checkout"]
    for label in modules:
        theirs = times[label]
        to_vllm = [o / v for o, v in zip(theirs, times["vLLM"], strict=True)]
        line = f"{label}: ÷ vLLM {quartiles(to_vllm)}"
        if label != "this checkout":
            to_mine = [o / m for o, m in zip(theirs, mine, strict=True)]
            line += f"; ÷ this checkout {quartiles(to_mine)}"
        print(line)


if __name__ == "__main__":
    main()
