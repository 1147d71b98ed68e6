"""The benchmarks: ``python -m bench.run`` (``make bench``) and its diagnostics, run as modules
from the repository's root (``python -m bench.ab_loop``, ``python -m bench.loop_calls``).

:mod:`bench.common` holds what they share; docs/bench.md says what each figure means.
"""
