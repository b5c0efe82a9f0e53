"""The run's prompts: loaded and checked once (StartRun reports bad data before a run starts),
and visited in a deterministic order that a checkpointed cursor can resume."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from brorl.errors import InvalidArgument


@dataclass(frozen=True)
class Prompt:
    text: str
    reference: str


def load_prompts(path: str, field: str = "data.train_path") -> list[Prompt]:
    """JSONL rows of {"prompt": str, "reference": any}; InvalidArgument names ``field`` (the
    run config's key of the file) and the bad line."""
    p = Path(path)
    if not p.is_file():
        raise InvalidArgument(field, f"file {p} does not exist")
    rows = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(field, f"line {n} is not JSON: {exc}") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise InvalidArgument(field, f"line {n} needs a non-empty string 'prompt'")
        rows.append(Prompt(row["prompt"], str(row.get("reference", ""))))
    if not rows:
        raise InvalidArgument(field, f"{p} holds no prompts")
    return rows


class PromptOrder:
    """Deterministic prompt order: a fresh permutation per epoch, addressed by a cursor."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self._epoch, self._perm = -1, []

    def __getitem__(self, cursor: int) -> int:
        epoch, i = divmod(cursor, self.n)
        if epoch != self._epoch:
            self._perm = list(range(self.n))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._perm)
            self._epoch = epoch
        return self._perm[i]
