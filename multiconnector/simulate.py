"""``multiconnector simulate``: a serving workload with injected faults, every invariant checked.

A scheduler admits requests into a KV block pool, fans each out to the connectors ``cache``,
``pd@0``, ``pd@1`` and ``nixl`` (registered as ``None``: its start failed) through a real
:class:`~multiconnector.MultiConnector`, delivers their reports after random latencies, cancels
some requests, and injects faults. The block pool checks, against the simulated connectors' own
ledgers, that no block is freed while a connector still owes a report, none twice, and none
never. The exit status is 1 when any invariant broke.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

import attrs

from ._args import Parser, output_file, unique_list
from ._workload import FAULT_KINDS, Simulation, SimulationConfig, SimulationResult
from ._workload.config import MAX_BLOCKS, MAX_POOL_BLOCKS, MAX_REQUESTS, MAX_THREADS
from .errors import InvalidArgumentError

__all__ = [
    "FAULT_KINDS",
    "SimulationConfig",
    "SimulationResult",
    "render_summary",
    "run_cli",
    "simulate",
]


def simulate(
    config: SimulationConfig | None = None,
    *,
    on_progress: Callable[[int, int], None] | None = None,
) -> SimulationResult:
    """Run one simulation (the defaults of :class:`SimulationConfig` when ``config`` is None)."""
    return Simulation(config or SimulationConfig(), on_progress=on_progress).run()


# -- output ------------------------------------------------------------------------------------


def _rows(result: SimulationResult) -> list[tuple[str, str]]:
    """The summary, as (label, value) rows; a label starting with two spaces is a detail."""
    rows: list[tuple[str, str]] = []
    config = result.config
    rows.append(("requests", f"{config.requests:,}"))
    rows.append(("  finished", f"{result.finished:,}"))
    rows.append(("  cancelled", f"{result.cancelled:,}"))
    rows.append(("events", f"{result.events:,}"))
    rows.append(("  applied", f"{result.outcomes.get('applied', 0):,}"))
    for outcome, n in result.outcomes.items():
        if outcome in ("drained", "overtaken"):  # recorded on a cancelled request's drain
            rows.append((f"  {outcome}", f"{n:,}"))
        elif outcome not in ("applied", "abandoned"):
            rows.append((f"  ignored: {outcome}", f"{n:,}"))
    for name, per in result.connector_outcomes.items():
        parts = ", ".join(f"{o} {n:,}" for o, n in per.items())
        rows.append((f"  reports from {name}", parts))
    if result.outcomes.get("abandoned"):
        rows.append(("saves abandoned by unregistering", f"{result.outcomes['abandoned']:,}"))
    stats = result.simulator
    rows.append(("params clashes (KeyClashError)", f"{stats['clashes']:,}"))
    rows.append(("fan-outs with a failure", f"{stats['connector_failures']:,}"))
    rows.append(("callbacks that raised", f"{stats['callback_failures']:,}"))
    if stats["report_batches"]:
        rows.append(
            (
                "reports delivered in batches",
                f"{stats['batched_reports']:,} in {stats['report_batches']:,} calls",
            )
        )
    rows.append(
        (
            "connectors unregistered / registered",
            f"{stats['unregistrations']:,} / {stats['registrations']:,}",
        )
    )
    rows.append(
        (
            "transfers aborted by shutdown",
            f"{stats['aborted_saves']:,} saves, {stats['aborted_loads']:,} loads",
        )
    )
    rows.append(("faults injected", f"{sum(result.faults.values()):,}"))
    for kind, n in result.faults.items():
        rows.append((f"  {kind}", f"{n:,}"))
    rows.append(("violations", f"{result.violation_count:,}"))
    for kind, n in result.violations.items():
        rows.append((f"  {kind}", f"{n:,}"))
    rows.append(("early frees", f"{result.early_frees:,}"))
    rows.append(("leaks", f"{sum(result.leaks.values()):,}"))
    for kind, n in result.leaks.items():
        if n:
            rows.append((f"  {kind.replace('_', ' ')}", f"{n:,}"))
    rows.append(("time", f"{result.elapsed:.1f} s"))
    rows.append(("events per second", f"{result.events_per_second:,.0f}"))
    return rows


def _title(result: SimulationResult) -> str:
    config = result.config
    verdict = "OK" if result.ok else "VIOLATIONS"
    faults = sorted(config.faults)
    shown = "all" if len(faults) == len(FAULT_KINDS) else ",".join(faults) or "none"
    threads = "1 thread" if config.threads == 1 else f"{config.threads} threads"
    return f"simulate: seed {config.seed}, {threads}, faults {shown}: {verdict}"


def render_summary(result: SimulationResult) -> str:
    """The summary table as plain text."""
    rows = _rows(result)
    width = max(len(label) for label, _ in rows)
    lines = [_title(result)]
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    for example in result.examples:
        lines.append(f"  ! {example['kind']} {example['request_id']}: {example['detail']}")
    return "\n".join(lines)


def _print_summary(result: SimulationResult, out: TextIO, fancy: bool) -> None:
    if fancy:
        try:
            from rich.console import Console  # noqa: PLC0415 - optional extra
            from rich.table import Table  # noqa: PLC0415
        except ImportError:
            fancy = False
    if not fancy:
        print(render_summary(result), file=out)
        return
    table = Table(title=_title(result), show_header=False, title_justify="left")
    table.add_column("what")
    table.add_column("value")
    for label, value in _rows(result):
        bad = label in {"violations", "early frees", "leaks"} and value != "0"
        table.add_row(label, f"[bold red]{value}[/]" if bad else value)
    console = Console(file=out)
    console.print(table)
    for example in result.examples:
        console.print(f"! {example['kind']} {example['request_id']}: {example['detail']}")


@contextmanager
def _progress(mode: str, total: int) -> Iterator[Callable[[int, int], None] | None]:
    """A progress callback: a rich bar, plain lines every 10 %, or nothing."""
    if mode == "none":
        yield None
        return
    if mode in {"auto", "rich"}:
        try:
            from rich.progress import (  # noqa: PLC0415 - optional extra
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TimeElapsedColumn,
            )
        except ImportError:
            mode = "plain"
        else:
            if mode == "rich" or sys.stderr.isatty():
                with Progress(
                    "[progress.description]{task.description}",
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    transient=False,
                ) as bar:
                    task = bar.add_task("requests", total=total)

                    def advance(done: int, _total: int) -> None:
                        bar.update(task, completed=done)

                    yield advance
                return
            mode = "plain"
    shown = [-1]

    def plain(done: int, total: int) -> None:
        tenth = done * 10 // total if total else 10
        if tenth > shown[0]:
            shown[0] = tenth
            print(f"simulate: {done:,}/{total:,} requests", file=sys.stderr, flush=True)

    yield plain


# -- the command -------------------------------------------------------------------------------


def _faults(text: str) -> frozenset[str]:
    if text.strip() == "all":
        return frozenset(FAULT_KINDS)
    if text.strip() == "none":
        return frozenset()
    kinds = frozenset(unique_list(text, "fault kinds (or all, or none)"))
    unknown = sorted(kinds - set(FAULT_KINDS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(FAULT_KINDS)}"
        )
    return kinds


def _parser() -> argparse.ArgumentParser:
    defaults = SimulationConfig()
    epilog = "fault kinds:\n" + "\n".join(f"  {k:<11} {v}" for k, v in FAULT_KINDS.items())
    parser = Parser(
        prog="multiconnector simulate",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--requests", type=int, default=defaults.requests,
        help=f"requests to run (%(default)s; at most {MAX_REQUESTS:,})")  # fmt: skip
    add("--seed", type=int, default=defaults.seed, help="the run's seed (%(default)s)")
    add("--threads", type=int, default=defaults.threads,
        help=f"threads delivering the connectors' reports (%(default)s; at most {MAX_THREADS}); "
        "only a 1-thread run is reproducible")  # fmt: skip
    add("--faults", type=_faults, default=defaults.faults, metavar="KIND[,KIND...]",
        help="fault kinds to inject: all (default), none, or a comma-separated list")  # fmt: skip
    add("--fault-rate", type=float, default=defaults.fault_rate,
        help="probability per request and fault kind (%(default)s)")  # fmt: skip
    add("--cancel-rate", type=float, default=defaults.cancel_rate,
        help="probability that a request is cancelled (%(default)s)")  # fmt: skip
    add("--blocks", type=int, default=defaults.blocks,
        help=f"KV blocks in the pool, {MAX_BLOCKS} to {MAX_POOL_BLOCKS:,} (%(default)s)"
        )  # fmt: skip
    add("--stripes", type=int, default=defaults.stripes,
        help="the aggregator's lock stripes, a power of two (%(default)s)")  # fmt: skip
    add("--json", type=output_file, metavar="FILE",
        help="also write the results as JSON to FILE (checked before the run; its folder must "
        "exist)")  # fmt: skip
    add("--progress", choices=("auto", "rich", "plain", "none"), default="auto",
        help="progress display; auto: a rich bar on a terminal, else plain lines")  # fmt: skip
    return parser


def run_cli(argv: Sequence[str]) -> int:
    """``multiconnector simulate [options]``: 0 when every invariant held, 1 otherwise."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        config = SimulationConfig(
            requests=args.requests,
            seed=args.seed,
            threads=args.threads,
            faults=args.faults,
            fault_rate=args.fault_rate,
            cancel_rate=args.cancel_rate,
            blocks=args.blocks,
            stripes=args.stripes,
        )
    except InvalidArgumentError as exc:  # "requests=... must be ...": named as its option
        field = str(exc).partition("=")[0]
        named = field in attrs.fields_dict(SimulationConfig)
        parser.error(f"argument --{field.replace('_', '-')}: {exc}" if named else str(exc))
    with _progress(args.progress, config.requests) as on_progress:
        result = simulate(config, on_progress=on_progress)
    _print_summary(result, sys.stdout, fancy=sys.stdout.isatty())
    if args.json is not None:
        data: dict[str, Any] = result.to_json()
        try:
            args.json.write_text(json.dumps(data, indent=2) + "\n")
        except OSError as exc:  # it could be written when checked; no longer
            print(f"{parser.prog}: error: cannot write --json: {exc}", file=sys.stderr)
            return 2
    return 0 if result.ok else 1
