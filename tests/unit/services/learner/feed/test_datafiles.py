"""Prompt data sets from the formats people keep them in, and one-line errors for bad ones."""

from __future__ import annotations

import json

import pytest

from brorl.errors import InvalidArgument
from services.learner.feed.datafiles import detect_format, read_rows

ROWS = [
    {"question": "1+2=", "answer": 3, "level": "easy"},
    {"question": "7*6=", "answer": 42, "level": "hard"},
    {"question": "9-9=", "answer": 0, "level": "easy"},
]


def write(path, kind, rows=ROWS):
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path.write_text(json.dumps(rows))
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif kind in ("csv", "tsv"):
        sep = "," if kind == "csv" else "\t"
        lines = [sep.join(rows[0])] + [sep.join(str(v) for v in r.values()) for r in rows]
        path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "csv", "tsv"])
def test_each_file_format_gives_the_same_rows(tmp_path, kind):
    rows = read_rows(str(write(tmp_path / f"data.{kind}", kind)))
    assert [r["question"] for r in rows] == ["1+2=", "7*6=", "9-9="]
    # CSV has only strings; the typed formats keep their types
    want = ["3", "42", "0"] if kind in ("csv", "tsv") else [3, 42, 0]
    assert [r["answer"] for r in rows] == want
    assert [r["level"] for r in rows] == ["easy", "hard", "easy"]


def test_a_saved_dataset_and_a_dataset_dict_split(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    ds.save_to_disk(str(tmp_path / "one"))
    assert read_rows(str(tmp_path / "one")) == ROWS
    dd = datasets.DatasetDict({"train": ds, "test": datasets.Dataset.from_list(ROWS[:1])})
    dd.save_to_disk(str(tmp_path / "dict"))
    assert detect_format(tmp_path / "dict", "auto", "f") == "hf_dataset"
    assert read_rows(str(tmp_path / "dict"), split="test") == ROWS[:1]
    with pytest.raises(InvalidArgument, match=r"no split 'dev'; it has \['test', 'train'\]"):
        read_rows(str(tmp_path / "dict"), split="dev", field="data.split")


def test_a_directory_of_shards_is_read_in_name_order(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    write(d / "part-1.parquet", "parquet", ROWS[1:])
    write(d / "part-0.parquet", "parquet", ROWS[:1])
    assert [r["question"] for r in read_rows(str(d))] == ["1+2=", "7*6=", "9-9="]


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.write_text('{"prompt": "a"}\nnot json\n'), "line 2 is not JSON"),
        (lambda p: p.write_text('{"prompt": "a"}\n[1, 2]\n'), "line 2 is not a JSON object"),
        (lambda p: p.write_text("\n\n"), "holds no rows"),
    ],
    ids=["missing", "bad-line", "not-object", "empty"],
)
def test_bad_jsonl_names_the_problem(tmp_path, setup, message):
    path = tmp_path / "data.jsonl"
    setup(path)
    with pytest.raises(InvalidArgument, match=message) as err:
        read_rows(str(path), field="data.train_path")
    assert err.value.field == "data.train_path"


def test_unknown_suffix_and_mixed_directory_ask_for_a_format(tmp_path):
    (tmp_path / "data.xlsx").write_text("x")
    with pytest.raises(InvalidArgument, match="set data.format"):
        read_rows(str(tmp_path / "data.xlsx"))
    d = tmp_path / "mixed"
    d.mkdir()
    write(d / "a.jsonl", "jsonl")
    write(d / "b.csv", "csv")
    with pytest.raises(InvalidArgument, match=r"found: \['csv', 'jsonl'\]"):
        read_rows(str(d))


def test_a_corrupt_parquet_file_is_an_invalid_argument(tmp_path):
    (tmp_path / "data.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(InvalidArgument, match="not a readable Parquet file"):
        read_rows(str(tmp_path / "data.parquet"))
