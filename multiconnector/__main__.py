"""``python -m multiconnector COMMAND``: the same as the ``multiconnector`` command."""

from .cli import main

raise SystemExit(main())
