"""``multiconnector check``: the command line."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Collection, Sequence
from typing import Final

from .._args import Parser, name_list, output_file, split_list, unique_list
from .._explore import EXIT_STATUS
from ..errors import (
    MultiConnectorError,
)
from ..usermachine.command import add_check_arguments, run_check_cli
from .run import check_aggregator
from .scenario import (
    ALPHABET,
    DEFAULT_CONNECTORS,
    DEFAULT_UNKNOWN,
    EARLY_REPORTS,
    KINDS,
    LOAD_EVENTS,
    MAX_CONNECTORS,
    MAX_REQUESTS,
    SAVER,
    SPLIT_EVENTS,
)

#: The kinds a ``--connectors`` item may name, as its help and errors show them.
_CHOICES: Final = "|".join(("saver", "none", *(k for k in KINDS if k != SAVER)))


def _parse_connectors(text: str) -> dict[str, str | None]:
    kinds: dict[str, str | None] = {}
    for item in split_list(text, f"NAME or NAME={_CHOICES}"):
        name, equals, kind = (part.strip() for part in item.partition("="))
        kind = kind.lower() if equals else SAVER
        if kind not in KINDS and kind != "none":
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected NAME or NAME={_CHOICES}, comma-separated"
            )
        (name,) = name_list(name)
        if name in kinds:
            raise argparse.ArgumentTypeError(f"{name!r} is given twice")
        kinds[name] = None if kind == "none" else kind
    if len(kinds) > MAX_CONNECTORS:
        raise argparse.ArgumentTypeError(
            f"{len(kinds)} connectors; a check takes at most {MAX_CONNECTORS}"
        )
    return kinds


def _parse_list(text: str) -> list[str]:
    return unique_list(text, "event kinds")


def _default_unknown(connectors: Collection[str]) -> list[str]:
    """``ghost``, or the first of ``ghost1``, ``ghost2``, ... that is not a connector's name."""
    more = (f"{DEFAULT_UNKNOWN[0]}{i}" for i in itertools.count(1))
    for name in itertools.chain(DEFAULT_UNKNOWN, more):
        if name not in connectors:
            return [name]
    raise AssertionError("unreachable")  # pragma: no cover


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _requests(text: str) -> int:
    value = _positive(text)
    if value > MAX_REQUESTS:
        raise argparse.ArgumentTypeError(f"{text!r} must be at most {MAX_REQUESTS}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds above 0")
    return value


def _parser() -> argparse.ArgumentParser:
    """The parser of ``multiconnector check``: scenario, search, then output options."""
    parser = Parser(
        prog="multiconnector check",
        description="Explore every reachable state of a bounded scenario on the real "
        "MultiConnector and check its properties. Exit status: 0 PASS (every property "
        "holds; with --max-depth, within that depth), 1 FAIL (a property fails), 2 bad "
        "arguments, 3 INCONCLUSIVE (--max-states or --max-seconds cut the search short "
        "before any violation was found).",
    )
    _add_scenario_arguments(parser)
    _add_search_arguments(parser)
    parser.add_argument(
        "--json",
        type=output_file,
        default=None,
        metavar="FILE",
        help="also write the report as JSON to FILE (checked before the search starts; its "
        "folder must exist)",
    )
    parser.add_argument("--no-progress", action="store_true", help="never show progress")
    add_check_arguments(parser)
    return parser


def _add_scenario_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's options: its connectors, unknown names, requests and alphabet."""
    default = ",".join(
        n if k == SAVER else f"{n}={k or 'none'}" for n, k in DEFAULT_CONNECTORS.items()
    )
    parser.add_argument(
        "--connectors",
        type=_parse_connectors,
        default=None,  # None: not given (refused with --machine even when typed as the default)
        metavar="SPEC",
        help=f"NAME[={_CHOICES}],..., at most {MAX_CONNECTORS} (default: {default})",
    )
    parser.add_argument(
        "--unknown",
        type=name_list,
        default=None,
        metavar="NAMES",
        help="names never registered, comma-separated (default: ghost, or the first of ghost1, "
        "ghost2, ... that --connectors does not name)",
    )
    parser.add_argument(
        "--requests",
        type=_requests,
        default=None,  # None: check_aggregator's default, 2
        metavar="N",
        help=f"request ids, 1 to {MAX_REQUESTS} (default: 2)",
    )
    parser.add_argument(
        "--events",
        type=_parse_list,
        default=None,
        metavar="KINDS",
        help=f"choose the alphabet among: {', '.join(ALPHABET + LOAD_EVENTS + SPLIT_EVENTS)} "
        "(default: all but the load and split events; request_finished_by, the told path the "
        "vLLM adapter uses, included: leave it out to check the asking path alone)",
    )
    parser.add_argument(
        "--load",
        action="store_true",
        help="add the load side (match_tokens, load_finished) to the alphabet and check "
        "that a load is applied at most once, only from the chosen loader",
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="with the load side, split loads too (split_load: two loaders for one request, "
        "each owing its report): check that the request is freed once, after both",
    )
    parser.add_argument(
        "--health",
        action="store_true",
        help="explore each child's health machine too (a real HealthBook, threshold 2, one "
        "probe): failure and cooled events interleaved with the others, lookups gated by it; "
        "check that an open child is never asked to look up nor chosen to load, that health "
        "moves only as declared, and that nothing owed is dropped",
    )
    parser.add_argument(
        "--params",
        action="store_true",
        help="scripted savers also answer transfer params (nothing, a key of their own, or "
        "that key plus a shared one, with equal or different values): check that they merge "
        "as documented, that a clash is raised exactly when keys clash, and that no saver's "
        "params are changed (multiplies the request_finished events by 4 per saver)",
    )
    parser.add_argument(
        "--early-reports",
        choices=EARLY_REPORTS,
        default=None,  # None: check_aggregator's default, savers
        help="which reports that come while request_finished still asks (kept as early) are "
        "explored: from the savers of that call (the default), from every ready connector "
        "not awaited (all), or none (off); see docs/check.md, Early reports",
    )


def _add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """The search's options: its bounds, its reductions and how coverage is judged."""
    parser.add_argument(
        "--max-states",
        type=_positive,
        default=None,
        metavar="N",
        help="stop after N distinct states: the result is INCONCLUSIVE (exit 3) unless a "
        "property fails",
    )
    parser.add_argument(
        "--max-depth",
        type=_positive,
        default=None,
        metavar="N",
        help="explore event sequences of up to N events only: an accepted bound, so the "
        "result PASSes (bounded) when no property fails within it",
    )
    parser.add_argument(
        "--max-seconds",
        type=_seconds,
        default=None,
        metavar="N",
        help="a time budget for CI: stop cleanly after N seconds; the result is INCONCLUSIVE "
        "(exit 3) unless a property fails, and says up to which depth the search is complete",
    )
    parser.add_argument(
        "--no-reduction",
        action="store_true",
        help="apply every interleaving of different requests' events (no partial-order "
        "reduction): the same verdicts, more time",
    )
    parser.add_argument(
        "--no-forget",
        action="store_true",
        help="keep every name of a settled record (finished or cancelled) in the state: by "
        "default the names nothing reads again (expected, abandoned) are left out; the same "
        "verdicts, more states",
    )
    parser.add_argument(
        "--per-request",
        action="store_true",
        help="check each request's view (the registry and its own record) once instead of "
        "every combination of the requests' states: two requests cost about what one costs; "
        "assumes requests interact only through the registry, take and batches",
    )
    parser.add_argument(
        "--strict-coverage",
        action="store_true",
        help="fail when any declared state or transition is not reached, even one this "
        "configuration cannot reach (default: only the reachable ones)",
    )
    parser.add_argument(
        "--no-symmetry",
        action="store_true",
        help="do not merge states that differ only by request ids or same-kind connector names",
    )


def _alphabet(events: list[str] | None, load: bool, split: bool = False) -> list[str] | None:
    if not (load or split):
        return events
    return [
        *(ALPHABET if events is None else events),
        *LOAD_EVENTS,
        *(SPLIT_EVENTS if split else ()),
    ]


def run_cli(argv: Sequence[str]) -> int:
    """``multiconnector check``: 0 PASS, 1 FAIL, 2 bad input, 3 INCONCLUSIVE (cut short)."""
    parser = _parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # argparse exits 2 on errors, 0 for --help
        return exc.code if isinstance(exc.code, int) else 2
    if args.machine is not None or args.model is not None or args.invariant or args.free_guards:
        return run_check_cli(args, parser)
    connectors = DEFAULT_CONNECTORS if args.connectors is None else args.connectors
    unknown = args.unknown
    if unknown is None:
        unknown = _default_unknown(connectors)
    elif clash := [n for n in unknown if n in connectors]:
        names = ", ".join(clash)
        print(f"{parser.prog}: error: --unknown {names}: also in --connectors", file=sys.stderr)
        return 2
    try:
        # Options not given (None) are left out: check_aggregator's defaults apply.
        given = {"requests": args.requests, "early_reports": args.early_reports}
        report = check_aggregator(
            dict(connectors),
            **{k: v for k, v in given.items() if v is not None},
            unknown=unknown,
            events=_alphabet(args.events, args.load, args.split),
            symmetry=not args.no_symmetry,
            max_states=args.max_states,
            max_depth=args.max_depth,
            max_seconds=args.max_seconds,
            strict_coverage=args.strict_coverage,
            reduction=not args.no_reduction,
            params=args.params,
            per_request=args.per_request,
            forget=not args.no_forget,
            health=args.health,
            progress=not args.no_progress,
        )
    except MultiConnectorError as exc:
        print(f"multiconnector check: error: {exc}", file=sys.stderr)
        return 2
    print(report.to_text())
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        except OSError as exc:
            print(f"multiconnector check: error: cannot write --json: {exc}", file=sys.stderr)
            return 2
        print(f"report written to {args.json}")
    return EXIT_STATUS[report.verdict]
