"""The ``multiconnector`` command: ``multiconnector COMMAND [options]``.

Each command lives in its own module, which provides ``run_cli(argv) -> int``; this module only
dispatches, so importing the library never imports a command's dependencies.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "main"]

#: command name -> (module, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("multiconnector.demo", "a short tour: three connectors, faults, a clean finish"),
    "check": ("multiconnector.check", "exhaustively model-check the transfer state machine"),
    "diagram": ("multiconnector.diagram", "draw the state machine (mermaid, dot, svg, md)"),
    "simulate": ("multiconnector.simulate", "a serving workload with fault injection"),
}


def _usage() -> str:
    lines = ["usage: multiconnector COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<10} {about}" for name, (_, about) in COMMANDS.items()]
    lines += ["", "Run 'multiconnector COMMAND --help' for a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for bad arguments)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print(_usage())
        return 0 if args else 2
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"multiconnector: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(command[0])
    status: int = module.run_cli(args[1:])
    return status


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
