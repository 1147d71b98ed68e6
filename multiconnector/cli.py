"""The ``multiconnector`` command: ``multiconnector COMMAND [options]``.

Each command lives in its own module, which provides ``run_cli(argv) -> int``; this module only
dispatches, so importing the library never imports a command's dependencies.

A user mistake is one line on stderr and exit status 2, never a traceback. When the reader of
stdout goes away (``multiconnector --help | head -1``) the command ends quietly: with its own
status if it had finished, else 141 (the shell's status for a closed pipe). A command started
with no stdout at all (``multiconnector demo >&-``) is refused the same way as a mistake; a
character stdout's encoding cannot write (``PYTHONIOENCODING=ascii``) is written escaped
(``\\u2014``).
"""

from __future__ import annotations

import importlib
import io
import os
import sys
from collections.abc import Sequence

from . import __version__

__all__ = ["COMMANDS", "main"]

#: command name -> (module, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("multiconnector.demo", "a short tour: three connectors, faults, a clean finish"),
    "check": ("multiconnector.check.cli", "exhaustively model-check the transfer state machine"),
    "diagram": ("multiconnector.diagram", "draw the state machine (mermaid, dot, svg, md)"),
    "simulate": ("multiconnector.simulate", "a serving workload with fault injection"),
}


def _usage() -> str:
    lines = ["usage: multiconnector COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<10} {about}" for name, (_, about) in COMMANDS.items()]
    lines += [
        "",
        "options:",
        "  -h, --help  show this help and exit",
        "  --version   show the version",
    ]
    lines += ["", "Run 'multiconnector COMMAND --help' for a command's options."]
    return "\n".join(lines)


#: The exit status of a command interrupted by a closed stdout (128 + SIGPIPE, as a shell says).
CLOSED_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for bad arguments)."""
    if sys.stdout is None:  # started with its stdout closed: nowhere to write the results
        print("multiconnector: error: standard output is closed", file=sys.stderr)
        return 2
    for stream in (sys.stdout, sys.stderr):
        _escape_unencodable(stream)
    status: int | None = None
    try:
        status = _dispatch(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # here, not at exit: a closed pipe is caught below
    except BrokenPipeError:
        # The reader went away: say nothing more, and let nothing flush into the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return CLOSED_PIPE if status is None else status
    except KeyboardInterrupt:
        print("multiconnector: interrupted", file=sys.stderr)
        return 130
    if argv is None:
        # The command itself (not a caller's main([...])): everything is written and flushed,
        # so exit without freeing what a large check built, object by object (seconds past a
        # --max-seconds budget after a wide search).
        sys.stderr.flush()
        os._exit(status)
    return status


def _escape_unencodable(stream: object) -> None:
    """Characters ``stream``'s encoding lacks are written as escapes, not raised."""
    if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
        stream.reconfigure(errors="backslashreplace")


def _dispatch(args: list[str]) -> int:
    if args and args[0] in {"-h", "--help"}:
        print(_usage())
        return 0
    if args and args[0] == "--version":
        print(f"multiconnector {__version__}")
        return 0
    if not args or args[0].startswith("-"):
        what = "a command is required" if not args else f"unknown option {args[0]!r}"
        print(f"multiconnector: error: {what}; choose from {', '.join(COMMANDS)} (see --help)",
              file=sys.stderr)  # fmt: skip
        return 2
    command = COMMANDS.get(args[0])
    if command is None:
        print(
            f"multiconnector: error: unknown command {args[0]!r}; choose from "
            f"{', '.join(COMMANDS)} (see --help)",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(command[0])
    try:
        status: int = module.run_cli(args[1:])
    except SystemExit as exc:  # argparse's own exit: 0 for --help, 2 for bad arguments
        return exc.code if isinstance(exc.code, int) else 2
    return status


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
