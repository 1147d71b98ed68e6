"""A griffe extension for the API reference: a class assembled from mixins, shown as one class.

:class:`multiconnector.MultiConnector` is assembled in ``multiconnector/aggregator/`` from one
base per concept (lifecycle, saving, reports, loading, queries) over the shared books. Those
bases are how the source is laid out, not part of the API: for each class named in ``classes``
this lists every inherited member as the class's own, base after base from the last one (see the
class's comment), and shows no bases. It changes only what mkdocstrings renders, never the
package.
"""

from __future__ import annotations

from typing import Any

import griffe


class FlattenMixins(griffe.Extension):
    """Inherited members become the class's own; its bases are not shown."""

    def __init__(self, classes: list[str]) -> None:
        super().__init__()
        self.classes = classes

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for path in self.classes:
            package, _, rest = path.partition(".")
            if package != pkg.path:
                continue
            cls = pkg.get_member(rest)
            # The signatures the class declares for type checkers alone (``if TYPE_CHECKING:``,
            # no docstring) stand for the bases' members, which are documented: dropped here.
            for name in [n for n, m in cls.members.items() if m.is_function or m.is_attribute]:
                member = cls.members[name]
                if member.docstring is None and any(name in b.members for b in cls.mro()):
                    cls.del_member(name)
            inherited = cls.inherited_members  # reversed MRO, each base in source order
            cls.bases = []
            for name, alias in inherited.items():
                cls.set_member(name, griffe.Alias(name, alias.final_target, parent=cls))
