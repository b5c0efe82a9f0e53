"""brorl.weights.codec: bf16 rounding against a float64 reference, deltas against a per-element
reference, keyframes as real safetensors files, corrupt input refused."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest

from brorl.weights import codec

SHAPES = [(1,), (7,), (3, 5), (2, 3, 11), (129, 7), (4097,)]


def bf16_value(c: int) -> float:
    """float64 value of bf16 bits; the all-ones exponent counts as 2**128, the next power of
    two after the largest finite bf16 (IEEE rounding overflows to inf exactly there)."""
    sign = -1.0 if c & 0x8000 else 1.0
    exp, man = (c >> 7) & 0xFF, c & 0x7F
    if exp == 0xFF:
        return sign * 2.0**128
    if exp == 0:
        return sign * man * 2.0 ** (-126 - 7)
    return sign * (1 + man / 128) * 2.0 ** (exp - 127)


def bf16_reference(x: float) -> int:
    """Nearest bf16 bits of a finite float32 value (float64 arithmetic, ties to even bits)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    lo = bits >> 16  # truncation: the neighbour towards zero
    err_lo, err_hi = abs(x - bf16_value(lo)), abs(x - bf16_value(lo + 1))
    if err_lo == err_hi:
        return lo if lo % 2 == 0 else lo + 1
    return lo if err_lo < err_hi else lo + 1


def edge_values() -> np.ndarray:
    tie = lambda keep: struct.unpack("<f", struct.pack("<I", (keep << 16) | 0x8000))[0]  # noqa: E731
    return np.array(
        [0.0, -0.0, 1.0, -1.0, 1e-40, -1e-40, 1.17e-38, 3.0e38, -3.0e38, 3.4e38, 1 / 3, -2 / 3]
        + [tie(0x3F80), tie(0x3F81), -tie(0x3F80), tie(0x0001), tie(0x0002)]
        + [np.nextafter(np.float32(1.0), np.float32(2.0)), np.float32(1.00390625)],
        dtype=np.float32,
    )


@pytest.mark.parametrize("shape", SHAPES)
def test_bf16_rounding_matches_the_float64_reference(shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 1e4], size=shape)).astype(np.float32)
    bits = codec.serving_bits(x, "bf16")
    assert bits.shape == shape and bits.dtype == np.uint16
    want = [bf16_reference(v) for v in x.ravel().tolist()]
    assert bits.ravel().tolist() == want


def test_bf16_rounding_on_ties_subnormals_and_extremes():
    x = edge_values()
    assert codec.serving_bits(x, "bf16").tolist() == [bf16_reference(v) for v in x.tolist()]


def test_bf16_rounding_is_what_torch_does():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = np.concatenate([edge_values(), rng.standard_normal(10_001).astype(np.float32) * 0.02])
    ours = codec.serving_bits(x, "bf16")
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, theirs)


def test_bits_round_trip_to_float32_exactly():
    x = np.random.default_rng(0).standard_normal((5, 9)).astype(np.float32)
    assert np.array_equal(codec.bits_to_float32(codec.serving_bits(x, "fp32"), "fp32"), x)
    b = codec.serving_bits(x, "bf16")
    assert np.array_equal(codec.serving_bits(codec.bits_to_float32(b, "bf16"), "bf16"), b)


def delta_reference(old: np.ndarray, new: np.ndarray) -> dict[int, int]:
    """Flat index -> new bit pattern for every element that changed (per-element loop)."""
    return {i: int(b) for i, (a, b) in enumerate(zip(old.ravel(), new.ravel())) if a != b}


def mutate(bits: np.ndarray, density: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = bits.copy()
    flat = out.reshape(-1)
    hit = rng.random(flat.size) < density
    flat[hit] ^= rng.integers(1, 2 ** (8 * bits.itemsize), size=int(hit.sum()), dtype=bits.dtype)
    return out


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.2, 0.26, 0.9, 1.0])
def test_delta_reconstructs_exactly_and_matches_the_reference(dtype, density):
    rng = np.random.default_rng(7)
    old = {
        f"t{i}": codec.serving_bits(rng.standard_normal(s).astype(np.float32), dtype)
        for i, s in enumerate(SHAPES)
    }
    new = {n: mutate(b, density, i) for i, (n, b) in enumerate(old.items())}
    payload, changed = codec.encode_delta(old, new)
    assert changed == sum(len(delta_reference(old[n], new[n])) for n in old)
    state = {n: b.copy() for n, b in old.items()}
    decoded = codec.decode_delta(payload, state)
    for name, (values, idx) in decoded.items():
        codec.xor_into(state[name], values, idx)
    for name in old:
        assert np.array_equal(state[name], new[name]), name
        ref = delta_reference(old[name], new[name])
        got = delta_reference(old[name], state[name])
        assert got == ref
    assert set(decoded) == {n for n in old if not np.array_equal(old[n], new[n])}
    for name, (values, idx) in decoded.items():  # XOR again: back to the base exactly
        codec.xor_into(state[name], values, idx)
    assert all(np.array_equal(state[n], old[n]) for n in old)


def test_sparse_and_dense_encodings_are_chosen_by_density():
    old = np.zeros(1000, dtype=np.uint16)
    assert codec.encode_tensor(old, old) is None
    sparse = codec.encode_tensor(old, mutate(old, 0.05, 1))
    dense = codec.encode_tensor(old, mutate(old, 0.6, 1))
    assert sparse[0] == "sparse" and dense[0].startswith("xor")
    assert len(sparse[2]) < len(dense[2])


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_a_dense_xor_costs_about_its_noisy_low_plane(dtype):
    rng = np.random.default_rng(3)
    n, k = 200_000, np.dtype(dtype).itemsize
    old = rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype)
    # as after an AdamW step: every element's last bits move, so the XOR's low byte is noise
    ulps = old ^ rng.integers(1, 256, n).astype(dtype)
    enc, changed, blob = codec.encode_tensor(old, ulps)
    assert enc == "xor" and changed == n
    assert n < len(blob) < n + 0.01 * (k - 1) * n  # the low plane as it is, the others ~nothing
    ones = old ^ (rng.random(n) < 0.3).astype(dtype)
    assert codec.encode_tensor(old, ones)[0] == "xor"
    for new in (ulps, ones):
        e, c, b = codec.encode_tensor(old, new)
        values, idx = codec.decode_tensor(e, c, b, n, dtype)
        assert idx is None and np.array_equal(values, old ^ new)


@pytest.mark.parametrize("dtype", ["<u2", ">u2", "<u4", ">u4"])
@pytest.mark.parametrize("n", [1, 7, 4097])
def test_byte_planes_are_the_files_layout_whatever_the_byte_order(dtype, n):
    """The delta file's planes: every word's lowest byte, then the next (the per-element
    reference below); read back into the words whatever the input's byte order."""
    rng = np.random.default_rng(n)
    k = np.dtype(dtype).itemsize
    x = rng.integers(0, 2 ** (8 * k) - 1, n, dtype=np.uint64).astype(dtype)
    planes = codec._planes(x)
    want = bytes((int(w) >> (8 * p)) & 0xFF for p in range(k) for w in x)
    assert planes == want
    back = codec._unplanes(planes, dtype, n)
    assert back.dtype == np.dtype(dtype) and np.array_equal(back, x)
    assert codec._planes(np.array([0x0102, 0x0304], dtype=dtype)) == (
        b"\x02\x04\x01\x03" if k == 2 else b"\x02\x04\x01\x03" + bytes(4)
    )


def deflated_delta(old: dict, new: dict) -> bytes:
    """A delta file as brorl wrote it before zstd (``BRDELTA1``, zlib blobs): a dense XOR's low
    plane stored as it is (``xor_raw1``), sparse tensors as gaps and values."""
    entries, blobs, offset = {}, [], 0
    for name in old:
        o, x = old[name].ravel(), np.bitwise_xor(old[name].ravel(), new[name].ravel())
        idx = np.flatnonzero(x)
        if idx.size > 0.25 * o.size:
            planes = codec._planes(x)
            enc, blob = "xor_raw1", planes[: o.size] + zlib.compress(planes[o.size :])
        else:
            gaps = np.diff(idx, prepend=0).astype(np.uint32)
            enc, blob = "sparse", zlib.compress(codec._planes(gaps) + codec._planes(x[idx]))
        entries[name] = {
            "enc": enc,
            "changed": int(idx.size),
            "offset": offset,
            "length": len(blob),
        }
        blobs.append(blob)
        offset += len(blob)
    header = json.dumps({"tensors": entries}).encode()
    return b"BRDELTA1" + struct.pack("<Q", len(header)) + header + b"".join(blobs)


def test_a_deflated_delta_of_an_earlier_brorl_is_still_read():
    rng = np.random.default_rng(5)
    old = {
        "dense": rng.integers(0, 2**16, 1000, dtype=np.uint16),
        "sparse": np.zeros(999, np.uint16),
    }
    new = {"dense": old["dense"] ^ rng.integers(1, 256, 1000).astype(np.uint16)}
    new["sparse"] = mutate(old["sparse"], 0.05, 1)
    state = {n: b.copy() for n, b in old.items()}
    for name, (values, idx) in codec.decode_delta(deflated_delta(old, new), state).items():
        codec.xor_into(state[name], values, idx)
    assert all(np.array_equal(state[n], new[n]) for n in old)


def test_a_malformed_raw_plane_encoding_is_refused():
    old = np.arange(1000, dtype=np.uint16)
    new = old ^ np.random.default_rng(0).integers(1, 256, 1000).astype(np.uint16)
    planes = codec._planes(old ^ new)
    blob = planes[:1000] + zlib.compress(planes[1000:])
    assert np.array_equal(
        codec.decode_tensor("xor_raw1", 1000, blob, 1000, np.uint16, True)[0], old ^ new
    )
    with pytest.raises(codec.CodecError, match="unknown encoding"):
        codec.decode_tensor("xor_raw2", 1000, blob, 1000, np.uint16, deflated=True)
    with pytest.raises(codec.CodecError, match="unknown encoding"):  # only in a deflated file
        codec.decode_tensor("xor_raw1", 1000, blob, 1000, np.uint16)
    with pytest.raises(codec.CodecError, match="raw planes"):
        codec.decode_tensor("xor_raw1", 1000, blob[:500], 1000, np.uint16, deflated=True)
    with pytest.raises(codec.CodecError, match="decompress"):
        codec.decode_tensor("xor_raw1", 1000, blob[:1000] + b"junk", 1000, np.uint16, True)


def test_a_blob_of_another_size_or_with_a_flipped_byte_is_refused():
    x = np.arange(1000, dtype=np.uint16)
    blob = codec._pack(codec._planes(x))
    assert np.array_equal(codec.decode_tensor("xor", 1000, blob, 1000, np.uint16)[0], x)
    with pytest.raises(codec.CodecError, match="expected"):
        codec.decode_tensor("xor", 1000, blob, 999, np.uint16)
    with pytest.raises(codec.CodecError, match="decompress"):  # a zlib blob in a zstd file
        codec.decode_tensor("xor", 1000, zlib.compress(codec._planes(x)), 1000, np.uint16)
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0x01  # the frame's checksum catches it
    with pytest.raises(codec.CodecError, match="decompress"):
        codec.decode_tensor("xor", 1000, bytes(flipped), 1000, np.uint16)


def test_keyframe_is_a_safetensors_file_torch_loads(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    rng = np.random.default_rng(1)
    floats = {f"m.w{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(SHAPES)}
    for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        bits = {n: codec.serving_bits(x, dtype) for n, x in floats.items()}
        path = tmp_path / f"{dtype}.safetensors"
        assert codec.write_keyframe(path, bits, dtype) == path.stat().st_size
        back = codec.read_keyframe(path, dtype)
        assert back.keys() == bits.keys()
        assert all(np.array_equal(back[n], bits[n]) for n in bits)
        assert all(back[n].shape == bits[n].shape for n in bits)
        loaded = load_file(str(path))
        for n, b in bits.items():
            assert loaded[n].dtype == torch_dtype and tuple(loaded[n].shape) == b.shape
            assert np.array_equal(loaded[n].float().numpy(), codec.bits_to_float32(b, dtype))


def test_tensor_hash_covers_every_bit():
    bits = np.arange(12, dtype=np.uint16).reshape(3, 4)
    flipped = bits.copy()
    flipped[2, 3] ^= 1
    assert codec.tensor_sha256(bits) != codec.tensor_sha256(flipped)
    assert codec.tensor_sha256(bits) == codec.tensor_sha256(bits.copy())


def test_tensor_hashes_match_one_by_one_in_order():
    rng = np.random.default_rng(5)
    tensors = {f"t{i}": rng.integers(0, 2**16, s, dtype=np.uint16) for i, s in enumerate(SHAPES)}
    hashes = codec.tensor_hashes(tensors)
    assert list(hashes) == list(tensors)
    assert hashes == {n: codec.tensor_sha256(b) for n, b in tensors.items()}


def test_parallel_map_keeps_order_and_raises_the_first_error(monkeypatch):
    monkeypatch.setattr(codec, "THREADS", 2)
    assert codec.parallel_map(lambda x: x * x, range(50)) == [x * x for x in range(50)]

    def fail_at_7(x):
        if x == 7:
            raise codec.CodecError("seven")
        return x

    with pytest.raises(codec.CodecError, match="seven"):
        codec.parallel_map(fail_at_7, range(20))
    # nested: every pool thread waiting on the pool would hang; inner calls run in place
    nested = codec.parallel_map(lambda x: codec.parallel_map(lambda y: x * y, range(4)), range(8))
    assert nested == [[x * y for y in range(4)] for x in range(8)]


def test_corrupt_deltas_are_refused_before_anything_is_applied():
    old = {"a": np.zeros(300, dtype=np.uint16), "b": np.zeros((4, 5), dtype=np.uint16)}
    new = {"a": mutate(old["a"], 0.1, 2), "b": mutate(old["b"], 0.5, 3)}
    payload, _ = codec.encode_delta(old, new)
    for bad in (
        b"XXXXXXXX" + payload[8:],  # magic
        payload[:-5],  # truncated blob
        payload[:-1] + bytes([payload[-1] ^ 0xFF]),  # a flipped byte in the last blob
    ):
        with pytest.raises(codec.CodecError):
            codec.decode_delta(bad, old)
    with pytest.raises(codec.CodecError, match="lacks"):
        codec.decode_delta(payload, {"a": old["a"]})
    with pytest.raises(codec.CodecError, match="not one of"):
        codec.serving_bits(np.zeros(2, np.float32), "fp16")


def test_sparse_blobs_with_repeated_or_out_of_range_indices_are_refused():
    def blob(gaps, values):
        g, v = np.array(gaps, np.uint32), np.array(values, np.uint16)
        return codec._pack(codec._planes(g) + codec._planes(v))

    values, idx = codec.decode_tensor("sparse", 2, blob([1, 2], [5, 6]), 4, np.uint16)
    assert idx.tolist() == [1, 3] and values.tolist() == [5, 6]
    with pytest.raises(codec.CodecError, match="repeats"):
        codec.decode_tensor("sparse", 2, blob([1, 0], [5, 6]), 4, np.uint16)
    with pytest.raises(codec.CodecError, match="beyond"):
        codec.decode_tensor("sparse", 2, blob([1, 3], [5, 6]), 4, np.uint16)
