"""``multiconnector check --machine`` and its options."""

from __future__ import annotations

import json
import sys
from typing import Any, Final

from .._explore import EXIT_STATUS
from ..errors import InvalidArgumentError, InvalidMachineError
from .analysis import check_machine
from .declaration import load

__all__ = ["add_check_arguments", "run_check_cli"]

# -- the command ---------------------------------------------------------------------------------

#: The aggregator scenario's options, which mean nothing for a machine of your own.
_AGGREGATOR_OPTIONS: Final = (
    "connectors",
    "unknown",
    "requests",
    "events",
    "load",
    "split",
    "params",
    "early_reports",
    "per_request",
    "no_reduction",
    "strict_coverage",
    "no_symmetry",
)


def add_check_arguments(parser: Any) -> None:
    """The ``--machine`` options of ``multiconnector check``."""
    group = parser.add_argument_group(
        "your own machine",
        "check a transitions machine of your own instead of the transfer machine",
    )
    group.add_argument(
        "--machine",
        metavar="MODULE:ATTR",
        help="a transitions Machine, a machine class or factory, or a declaration dict "
        "(states, transitions, initial, final); the current directory is importable",
    )
    group.add_argument(
        "--model",
        metavar="MODULE:ATTR",
        help="a factory of fresh models: guards and callbacks run for real (default: a "
        "machine class or factory whose machines have a model; otherwise guards are free)",
    )
    group.add_argument(
        "--free-guards",
        action="store_true",
        help="treat every named guard as a free choice, even with a model factory",
    )
    group.add_argument(
        "--invariant",
        metavar="MODULE:ATTR",
        action="append",
        default=[],
        help="a predicate over the model that must hold in every reachable state (repeatable)",
    )


def run_check_cli(args: Any, parser: Any) -> int:
    """``multiconnector check --machine``: 0 PASS, 1 a property FAILs, 2 bad input, 3
    INCONCLUSIVE (``--max-states`` or ``--max-seconds`` cut the search short)."""
    if args.machine is None:
        given = [
            option
            for option, value in (
                ("--model", args.model),
                ("--free-guards", args.free_guards),
                ("--invariant", args.invariant),
            )
            if value
        ]
        options = " and ".join([", ".join(given[:-1]), given[-1]] if given[:-1] else given)
        verb = "needs" if len(given) == 1 else "need"
        print(f"{parser.prog}: error: {options} {verb} --machine", file=sys.stderr)
        return 2
    # Each of these defaults to None (a value) or False (a flag): typed out, even as the
    # default value, it is refused.
    given = [o for o in _AGGREGATOR_OPTIONS if getattr(args, o) not in (None, False)]
    if given:
        print(
            f"{parser.prog}: error: "
            + ", ".join("--" + o.replace("_", "-") for o in given)
            + (" applies" if len(given) == 1 else " apply")
            + " to the transfer machine, not to --machine",
            file=sys.stderr,
        )
        return 2
    try:
        model = load(args.model, "--model") if args.model is not None else None
        invariants = {spec.rpartition(":")[2]: load(spec, "--invariant") for spec in args.invariant}
        report = check_machine(
            load(args.machine, "--machine"),
            name=args.machine,
            model=model,
            free_guards=args.free_guards,
            invariants=invariants,
            max_states=args.max_states,
            max_depth=args.max_depth,
            max_seconds=args.max_seconds,
            progress=not args.no_progress,
        )
    except (InvalidArgumentError, InvalidMachineError) as exc:
        text = str(exc).replace(":\n  - ", ": ").replace("\n  - ", "; ")
        print(f"{parser.prog}: error: {_blamed(exc, args)}{text}", file=sys.stderr)
        return 2
    print(report.to_text())
    if args.json is not None:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        except OSError as exc:
            print(f"{parser.prog}: error: cannot write --json: {exc}", file=sys.stderr)
            return 2
        print(f"report written to {args.json}")
    return EXIT_STATUS[report.verdict]


def _blamed(exc: Exception, args: Any) -> str:
    """The option an error of :func:`check_machine` is about, as its message's prefix.

    :func:`load` names the option itself (``--model='x:y': ...``); the check names its own
    parameter first (``model=...``, ``invariants ...``); anything else is about the machine.
    """
    text = str(exc)
    if isinstance(exc, InvalidArgumentError) and text.startswith("--"):
        return ""
    if text.startswith("model=") and args.model is not None:
        return f"--model {args.model}: "
    if text.startswith("invariants"):
        return "--invariant: "
    # A machine class or factory is its own model factory when --model is not given.
    return f"--machine {args.machine}: "
