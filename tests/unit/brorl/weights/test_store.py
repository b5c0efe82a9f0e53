import pytest

from brorl.errors import FailedPrecondition
from brorl.weights.store import STABLE, WeightStore


def stage(store, version, payload=b"weights"):
    staging = store.staging_dir(version)
    (staging / "model.safetensors").write_bytes(payload)
    return staging


def test_commit_then_verify(tmp_path):
    store = WeightStore(tmp_path)
    pointer = store.commit(1, stage(store, 1))
    assert pointer.version == 1 and pointer.kind == "full" and pointer.bytes == len(b"weights")
    assert store.verify(pointer) == store.version_dir(1)
    assert not list(tmp_path.glob(".staging*"))


def test_incomplete_or_corrupt_versions_are_refused(tmp_path):
    store = WeightStore(tmp_path)
    pointer = store.commit(1, stage(store, 1))
    (store.version_dir(1) / "model.safetensors").write_bytes(b"tampered")
    with pytest.raises(FailedPrecondition, match="corrupt"):
        store.verify(pointer)
    pointer2 = store.commit(2, stage(store, 2))
    (store.version_dir(2) / STABLE).unlink()
    with pytest.raises(FailedPrecondition, match="not complete"):
        store.verify(pointer2)


def test_prune_keeps_newest(tmp_path):
    store = WeightStore(tmp_path)
    for v in range(1, 6):
        store.commit(v, stage(store, v))
    store.prune(2)
    assert sorted(p.name for p in tmp_path.glob("v*")) == ["v00000004", "v00000005"]
