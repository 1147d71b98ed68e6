"""Small scripted connectors shared by the tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class Scripted:
    """Answers request_finished as told; records every call."""

    def __init__(
        self,
        saves: bool = True,
        params: Mapping[str, Any] | None = None,
        *,
        tokens: int | None = 0,
        raises: Exception | None = None,
    ) -> None:
        self.saves = saves
        self.params = params
        self.tokens = tokens
        self.raises = raises
        self.finished_calls: list[tuple[str, tuple[int, ...]]] = []
        self.on_finished_calls: list[tuple[str, tuple[int, ...]]] = []
        self.loads: list[str] = []
        self.shut = 0

    def request_finished(
        self, request_id: str, blocks: Sequence[int]
    ) -> tuple[bool, Mapping[str, Any] | None]:
        self.finished_calls.append((request_id, tuple(blocks)))
        if self.raises is not None:
            raise self.raises
        return self.saves, self.params

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        if self.raises is not None:
            raise self.raises
        return self.tokens

    def on_finished(self, request_id: str, blocks: Sequence[int]) -> None:
        self.on_finished_calls.append((request_id, tuple(blocks)))

    def on_load_finished(self, request_id: str) -> None:
        self.loads.append(request_id)

    def get_stats(self) -> dict[str, int]:
        if self.raises is not None:
            raise self.raises
        return {"finished": len(self.finished_calls)}

    def shutdown(self) -> None:
        self.shut += 1
        if self.raises is not None:
            raise self.raises
