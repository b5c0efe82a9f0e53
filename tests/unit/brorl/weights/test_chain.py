"""Keyframe + delta chains on real files: bit-exact reconstruction over 20 versions, catching
up from far behind, corrupt versions refused, undo on a hash mismatch, chain-aware pruning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from brorl.weights import codec
from brorl.weights.chain import (
    ChainError,
    Held,
    ServingState,
    plan_chain,
    read_step,
    verified_steps,
)
from brorl.weights.store import MANIFEST, STABLE, WeightStore, sha256_file
from tests.weight_versions import VersionRun


def newest(run: VersionRun):
    p = run.pointers[-1]
    return read_step(Path(p.uri), p.version, p.sha256)


def sync(state: ServingState, run: VersionRun, careful: bool = False):
    step = newest(run)
    versions = plan_chain(step, state.held, "r")
    steps, error = verified_steps(step, versions, state.held.sha256)
    assert error is None
    state.apply_chain(steps, "r", careful)
    return versions


def assert_exact(state: ServingState, run: VersionRun, version: int):
    assert state.held.version == version
    want = run.expected[version]
    assert state.tensors.keys() == want.keys()
    for name, bits in want.items():
        assert np.array_equal(state.tensors[name], bits), name
        assert state.tensors[name].shape == bits.shape


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_twenty_versions_reconstruct_bit_exactly(tmp_path, dtype):
    run = VersionRun(tmp_path, dtype=dtype, keyframe_every=7, lr=1e-4)
    state = ServingState()
    kinds = []
    for v in range(21):
        run.publish()
        kinds.append(run.pointers[-1].kind)
        assert sync(state, run, careful=True) == [v]  # one version at a time, every hash checked
        assert_exact(state, run, v)
    assert [v for v, k in enumerate(kinds) if k == "full"] == [0, 7, 14]
    full, deltas = run.pointers[0].bytes, [p.bytes for p in run.pointers if p.kind == "delta"]
    assert max(deltas) < full  # sparse changes travel as less than a keyframe


def test_a_worker_at_version_0_catches_up_from_version_20(tmp_path):
    run = VersionRun(tmp_path, keyframe_every=100, lr=1e-4)
    run.publish()
    state = ServingState()
    sync(state, run)
    run.publish_many(20)
    assert sync(state, run) == list(range(1, 21))  # the deltas after the held version
    assert_exact(state, run, 20)
    # a fresh worker (nothing held) rebuilds from the keyframe
    fresh = ServingState()
    assert sync(fresh, run) == list(range(0, 21))
    assert_exact(fresh, run, 20)


def test_catching_up_across_keyframes_starts_from_the_last_keyframe(tmp_path):
    run = VersionRun(tmp_path, keyframe_every=8, lr=1e-4)
    run.publish()
    state = ServingState()
    sync(state, run)
    run.publish_many(20)
    assert sync(state, run) == [16, 17, 18, 19, 20]
    assert_exact(state, run, 20)


def test_a_flipped_byte_in_a_delta_is_refused_and_the_verified_prefix_kept(tmp_path):
    run = VersionRun(tmp_path, keyframe_every=100, lr=1e-4)
    run.publish_many(6)
    bad = Path(run.pointers[3].uri) / codec.DELTA_FILE
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x01
    bad.write_bytes(bytes(data))
    step = newest(run)
    steps, error = verified_steps(step, plan_chain(step, Held(), "r"), "")
    assert isinstance(error, ChainError) and error.version == 3 and "corrupt" in str(error)
    assert [s.version for s in steps] == [0, 1, 2]
    state = ServingState()
    state.apply_chain(steps, "r", careful=True)  # the keyframe + the deltas that verify
    assert_exact(state, run, 2)


def restamp(path: Path) -> None:
    """Make a tampered manifest self-consistent again (as a buggy producer would)."""
    (path / STABLE).write_text(sha256_file(path / MANIFEST))


def test_a_reconstruction_with_a_wrong_hash_is_undone(tmp_path):
    run = VersionRun(tmp_path, keyframe_every=100, lr=1e-4)
    run.publish_many(3)
    state = ServingState()
    sync(state, run)
    run.publish_many(2)  # versions 3, 4
    v3 = Path(run.pointers[3].uri)
    manifest = json.loads((v3 / MANIFEST).read_text())
    manifest["serving"]["tensors"]["layer.w"]["sha256"] = "0" * 64
    (v3 / MANIFEST).write_text(json.dumps(manifest))
    restamp(v3)
    steps = [read_step(v3, 3)]
    with pytest.raises(ChainError, match="layer.w: sha256"):
        state.apply_chain(steps, "r", careful=True)
    assert_exact(state, run, 2)  # undone: still exactly version 2
    with pytest.raises(ChainError):  # fast mode: the state is unknown afterwards, so cleared
        state.apply_chain(steps, "r", careful=False)
    assert state.held == Held() and not state.tensors


def test_a_delta_is_never_applied_to_a_state_that_is_not_its_base(tmp_path):
    run = VersionRun(tmp_path, keyframe_every=100, lr=1e-4)
    run.publish_many(4)
    state = ServingState()
    state.apply_chain([read_step(Path(run.pointers[0].uri), 0)], "r", careful=True)
    with pytest.raises(ChainError, match="not this delta's base"):
        state.apply_chain([read_step(Path(run.pointers[3].uri), 3)], "r", careful=True)
    assert_exact(state, run, 0)


def test_a_missing_delta_ends_the_chain(tmp_path):
    import shutil

    run = VersionRun(tmp_path, keyframe_every=100, lr=1e-4)
    run.publish_many(5)
    shutil.rmtree(run.pointers[2].uri)
    step = newest(run)
    steps, error = verified_steps(step, plan_chain(step, Held(), "r"), "")
    assert error.version == 2 and [s.version for s in steps] == [0, 1]


def test_prune_never_removes_the_keyframe_of_the_live_chain(tmp_path):
    run = VersionRun(tmp_path, keyframe_every=5, lr=1e-4)
    names = lambda: sorted(p.name for p in tmp_path.glob("v*"))  # noqa: E731
    run.publish_many(4)  # 0 keyframe, 1-3 deltas
    run.store.prune(2)
    assert names() == [f"v{v:08d}" for v in range(4)]
    run.publish_many(4)  # 4 delta, 5 keyframe, 6-7 deltas
    run.store.prune(2)
    assert names() == [f"v{v:08d}" for v in (5, 6, 7)]
    fresh = ServingState()
    sync(fresh, run)
    assert_exact(fresh, run, 7)
    store = WeightStore(tmp_path / "plain")  # versions of full kind only: the newest `keep`
    for v in range(4):
        staging = store.staging_dir(v)
        (staging / "model.safetensors").write_bytes(b"w")
        store.commit(v, staging)
    store.prune(2)
    assert sorted(p.name for p in store.root.glob("v*")) == ["v00000002", "v00000003"]


def test_pruning_after_every_version_keeps_the_chain_a_new_worker_rebuilds(tmp_path):
    """As the learner does: prune after each publish, from the first version on (fewer than
    ``keep`` versions at first). A worker that joins late rebuilds the newest version."""
    run = VersionRun(tmp_path, keyframe_every=5, lr=1e-4)
    for _ in range(8):  # 0 keyframe, 1-4 deltas, 5 keyframe, 6-7 deltas
        run.publish_many(1)
        run.store.prune(3)
    assert sorted(p.name for p in tmp_path.glob("v*")) == [f"v{v:08d}" for v in (5, 6, 7)]
    fresh = ServingState()
    sync(fresh, run)
    assert_exact(fresh, run, 7)


def test_reconstruct_rebuilds_any_published_version_from_its_keyframe(tmp_path):
    from brorl.weights.chain import reconstruct

    run = VersionRun(tmp_path, keyframe_every=4, lr=1e-4)
    run.publish_many(7)
    for v in (0, 2, 4, 6):
        assert_exact(reconstruct(Path(run.pointers[v].uri)), run, v)
    shutil_target = Path(run.pointers[5].uri) / codec.DELTA_FILE
    shutil_target.write_bytes(b"broken")
    with pytest.raises(ChainError, match="weight version 5"):
        reconstruct(Path(run.pointers[6].uri))


def test_a_version_from_another_chain_breaks_the_link(tmp_path):
    import shutil

    a = VersionRun(tmp_path / "a", keyframe_every=100, lr=1e-4, seed=0)
    b = VersionRun(tmp_path / "b", keyframe_every=100, lr=1e-4, seed=1)
    a.publish_many(5)
    b.publish_many(5)
    shutil.rmtree(a.pointers[2].uri)
    shutil.copytree(b.pointers[2].uri, a.pointers[2].uri)  # self-consistent, but not a's
    step = newest(a)
    steps, error = verified_steps(step, plan_chain(step, Held(), "r"), "")
    assert error.version == 2 and "broken link" in str(error)
    assert [s.version for s in steps] == [0, 1]
