"""Rows of a prompt data set, from the file formats people keep them in: JSONL (or a JSON list),
Parquet, CSV/TSV, a data set saved with Hugging Face ``datasets``' ``save_to_disk``, or a
directory of data files of one of those formats (shards, read in name order).

A row is a plain dict of column → Python value; which columns mean what is the caller's
business (services.learner.feed.prompts). Every problem is an InvalidArgument naming the config
field and, where there is one, the bad line or file.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from brorl.errors import InvalidArgument

SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
}
# Files `save_to_disk` writes: a Dataset (state.json) or a DatasetDict (dataset_dict.json).
SAVED_DATASET_MARKERS = ("dataset_dict.json", "state.json")


def detect_format(path: Path, fmt: str, field: str) -> str:
    """The format to read ``path`` as: ``fmt`` unless it is "auto"."""
    if fmt != "auto":
        return fmt
    if path.is_dir():
        if any((path / m).is_file() for m in SAVED_DATASET_MARKERS):
            return "hf_dataset"
        kinds = {SUFFIXES.get(p.suffix.lower()) for p in path.iterdir() if p.is_file()} - {None}
        if len(kinds) == 1:
            return kinds.pop()
        raise InvalidArgument(
            field,
            f"directory {path} is neither a saved `datasets` directory (no "
            f"{' or '.join(SAVED_DATASET_MARKERS)}) nor a folder of data files of one format "
            f"(found: {sorted(kinds) or 'none'}); set data.format",
        )
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise InvalidArgument(
            field,
            f"cannot tell the format of {path.name} from its suffix; name it "
            f"{'/'.join(SUFFIXES)} or set data.format",
        )
    return kind


def read_rows(
    path: str, fmt: str = "auto", split: str = "train", field: str = "data"
) -> list[dict]:
    """All rows of ``path`` (a file or a directory), as dicts, in file order."""
    p = Path(path)
    if not p.exists():
        raise InvalidArgument(field, f"{p} does not exist")
    kind = detect_format(p, fmt, field)
    if kind == "hf_dataset":
        rows = _saved_dataset(p, split, field)
    elif p.is_dir():
        files = sorted(f for f in p.iterdir() if SUFFIXES.get(f.suffix.lower()) == kind)
        rows = [row for f in files for row in _read_file(f, kind, field)]
    else:
        rows = _read_file(p, kind, field)
    if not rows:
        raise InvalidArgument(field, f"{p} holds no rows")
    return rows


def _read_file(path: Path, kind: str, field: str) -> list[dict]:
    readers = {
        "jsonl": _jsonl,
        "json": _json,
        "parquet": _parquet,
        "csv": lambda p, f: _csv(p, f, ","),
        "tsv": lambda p, f: _csv(p, f, "\t"),
    }
    if kind not in readers:
        raise InvalidArgument(field, f"format {kind!r} is for a directory, and {path} is a file")
    return readers[kind](path, field)


def _jsonl(path: Path, field: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidArgument(field, f"{path.name} line {n} is not JSON: {exc}") from None
            if not isinstance(row, dict):
                raise InvalidArgument(field, f"{path.name} line {n} is not a JSON object")
            rows.append(row)
    return rows


def _json(path: Path, field: str) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    if not text.lstrip().startswith("["):
        return _jsonl(path, field)  # a .json file of one object a line
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(field, f"{path.name} is not JSON: {exc}") from None
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise InvalidArgument(field, f"{path.name} item {bad} is not a JSON object")
    return rows


def _parquet(path: Path, field: str) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise InvalidArgument(field, f"{path.name} is not a readable Parquet file: {exc}") from None


def _csv(path: Path, field: str, delimiter: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return [dict(row) for row in csv.DictReader(f, delimiter=delimiter)]
    except (csv.Error, UnicodeDecodeError) as exc:
        raise InvalidArgument(field, f"{path.name} is not readable CSV: {exc}") from None


def _saved_dataset(path: Path, split: str, field: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise InvalidArgument(
            field, f"{path} is a saved `datasets` directory: pip install datasets"
        ) from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise InvalidArgument(field, f"{path} is not a loadable saved data set: {exc}") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise InvalidArgument(
                field, f"{path} has no split {split!r}; it has {sorted(loaded)} (data.split)"
            )
        loaded = loaded[split]
    return loaded.to_list()
