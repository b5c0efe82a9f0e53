"""Weight versions as serving-dtype bits: rounding, tensor hashes, keyframe and delta files.

A published version holds the policy in its *serving dtype* (``bf16`` or ``fp32``), handled
here as the raw bit patterns (bf16 as uint16, fp32 as uint32), so that reconstruction is exact
and a hash of the bits identifies a tensor. Two file kinds (docs/weights.md):

* keyframe ``model.safetensors``: every tensor, a standard safetensors file (BF16 / F32) that
  Hugging Face and vLLM load as it is;
* delta ``delta.bin``: per changed tensor, the XOR of its bits against the previous version,
  either sparse (gaps between changed indices + the XOR values) or dense (the whole XOR), as
  byte planes compressed with zstd. XOR makes applying a delta its own inverse. Deltas whose
  planes were deflated (zlib, ``BRDELTA1``: what brorl wrote before) are still read.

Torch-free (numpy + zstandard + zlib + hashlib), so the learner and the rollout engine share one
codec.
Shapes: every tensor is handled flat, ``(n,)``; its shape travels in the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, TypeVar

import numpy as np
import zstandard

# serving dtype -> (numpy bit type, safetensors dtype name)
SERVING_DTYPES = {"bf16": (np.uint16, "BF16"), "fp32": (np.uint32, "F32")}
KEYFRAME_FILE = "model.safetensors"
DELTA_FILE = "delta.bin"
_DELTA_MAGIC = b"BRDELTA2"  # blobs compressed with zstd
_DEFLATED_MAGIC = b"BRDELTA1"  # blobs deflated (zlib): read, never written
# Above this fraction of changed elements a dense XOR is as small as the sparse form and
# faster; below it the sparse form is smaller and faster (one 1536 x 2048 bf16 tensor, one core:
# 7.4 vs 13.7 ms at 7.5 %, 23.9 vs 18.8 ms at 40 %; docs/weights.md, "Compression").
DENSE_ABOVE = 0.25
# zstd at level 1 against zlib's deflate (level 1, run-length strategy) on a delta's byte planes,
# one core (docs/weights.md, "Compression"): a tensor's delta 2-3x faster to write and 3-4x
# faster to read, at up to 15 % more bytes. It stores a block that does not compress (a dense
# XOR's noisy low plane after an AdamW step) as it is, by itself, so no plane is sampled first.
_ZSTD_LEVEL = 1
# Threads for per-tensor work: sha256, zstd and numpy's element loops release the GIL, so
# tensors are rounded, hashed and diffed side by side (docs/weights.md, "Measured").
THREADS = max(1, min(4, len(os.sched_getaffinity(0))))
_POOL_NAME = "weight-codec"
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
T = TypeVar("T")
R = TypeVar("R")


class CodecError(ValueError):
    """A keyframe or delta file that cannot be decoded (corrupt, truncated, wrong shapes)."""


def parallel_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(x) for x in items]``, run on the codec's threads (in order; the first exception
    is raised). For per-tensor work on whole states: hashing, rounding, encoding. A call from
    one of those threads runs in that thread (waiting on the pool from inside it could wait
    forever)."""
    global _pool
    items = list(items)
    if THREADS == 1 or len(items) < 2 or threading.current_thread().name.startswith(_POOL_NAME):
        return [fn(x) for x in items]
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS, thread_name_prefix=_POOL_NAME)
    return list(_pool.map(fn, items))


def bit_type(dtype: str):
    if dtype not in SERVING_DTYPES:
        raise CodecError(f"serving dtype {dtype!r} is not one of {sorted(SERVING_DTYPES)}")
    return SERVING_DTYPES[dtype][0]


def serving_bits(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 array -> its serving-dtype bits (same shape). bf16 rounds to nearest, ties to
    even (what torch's ``.to(torch.bfloat16)`` does). Inputs must be finite."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    if dtype == "fp32":
        return u.copy()
    bit_type(dtype)
    # + 0x7FFF rounds half down, + 1 more when the kept lsb is odd: ties go to even. Finite
    # inputs stay below 0xFF800000, so the uint32 sum cannot wrap. In place on one temporary:
    # a fresh array per operation costs more in page faults than the arithmetic.
    rounded = u >> np.uint32(16)
    rounded &= np.uint32(1)
    rounded += np.uint32(0x7FFF)
    rounded += u
    rounded >>= np.uint32(16)
    return rounded.astype(np.uint16)


def bits_to_float32(bits: np.ndarray, dtype: str) -> np.ndarray:
    """The float32 value of serving-dtype bits (exact: bf16 is the top half of an fp32)."""
    if dtype == "fp32":
        return bits.view(np.float32)
    bit_type(dtype)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def tensor_sha256(bits: np.ndarray) -> str:
    """sha256 of a tensor's serving-dtype bytes (little-endian, C order)."""
    little = np.ascontiguousarray(bits).astype(bits.dtype.newbyteorder("<"), copy=False)
    return hashlib.sha256(memoryview(little).cast("B")).hexdigest()


def tensor_hashes(tensors: dict[str, np.ndarray]) -> dict[str, str]:
    """``tensor_sha256`` of every tensor, on the codec's threads."""
    return dict(zip(tensors, parallel_map(tensor_sha256, tensors.values())))


# -- keyframes: standard safetensors files --------------------------------------------------


def write_keyframe(path: Path, tensors: dict[str, np.ndarray], dtype: str) -> int:
    """Write ``tensors`` (bits, any shape) as a safetensors file of the serving dtype; returns
    the bytes written. Layout (safetensors spec): u64 header length, JSON header, data."""
    st_dtype = SERVING_DTYPES[dtype][1]
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, bits in tensors.items():
        header[name] = {
            "dtype": st_dtype,
            "shape": list(bits.shape),
            "data_offsets": [offset, offset + bits.nbytes],
        }
        offset += bits.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for bits in tensors.values():
            f.write(memoryview(np.ascontiguousarray(bits)).cast("B"))
    return 8 + len(raw) + offset


def read_keyframe(path: Path, dtype: str) -> dict[str, np.ndarray]:
    """The tensors of a keyframe written by ``write_keyframe`` (bits, with their shapes)."""
    data = Path(path).read_bytes()
    try:
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n])
    except (struct.error, ValueError) as exc:
        raise CodecError(f"{path}: not a safetensors file ({exc})") from None
    want = SERVING_DTYPES[dtype][1]
    body = memoryview(data)[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        if info["dtype"] != want or end > len(body):
            raise CodecError(f"{path}: tensor {name} is {info['dtype']} / out of range")
        flat = np.frombuffer(body[start:end], dtype=bit_type(dtype)).copy()
        out[name] = flat.reshape(info["shape"])
    return out


# -- deltas ---------------------------------------------------------------------------------


def _planes(x: np.ndarray) -> bytes:
    """(n,) little-endian words -> their bytes grouped by significance (all low bytes, then
    the next...): the high bytes of an XOR are mostly zero and compress to almost nothing."""
    # by shifts, not a (n, k) byte transpose: a strided copy of uint8 runs ~10x slower
    x = np.ascontiguousarray(x).ravel()
    words = x.astype(x.dtype.newbyteorder("="), copy=False)  # shifts act on values
    return b"".join((words >> (8 * i)).astype(np.uint8).tobytes() for i in range(x.dtype.itemsize))


def _unplanes(raw: bytes, dtype, n: int) -> np.ndarray:
    """The (n,) words of ``dtype`` whose byte planes ``_planes`` wrote."""
    k = np.dtype(dtype).itemsize
    if len(raw) != k * n:
        raise CodecError(f"expected {k * n} bytes, got {len(raw)}")
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(k, n)
    out = planes[k - 1].astype(np.dtype(dtype).newbyteorder("="))  # the top byte, then down
    for i in range(k - 2, -1, -1):
        out <<= 8
        out |= planes[i]
    return out.astype(dtype, copy=False)


def _pack(data) -> bytes:
    """``data`` as one zstd frame that records its size and a checksum of its content (a
    compressor per call: they are not thread-safe, and one costs microseconds)."""
    return zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_checksum=True).compress(data)


def _unpack(blob, size: int, deflated: bool) -> bytes:
    """The ``size`` bytes a blob holds (``deflated``: a zlib stream, else a zstd frame)."""
    try:
        if deflated:
            raw = zlib.decompress(blob)
        elif zstandard.frame_content_size(blob) != size:
            raise CodecError(f"delta blob does not hold the {size} bytes expected")
        else:
            raw = zstandard.ZstdDecompressor().decompress(blob)
    except (zlib.error, zstandard.ZstdError) as exc:
        raise CodecError(f"delta blob does not decompress: {exc}") from None
    if len(raw) != size:
        raise CodecError(f"delta blob holds {len(raw)} bytes, expected {size}")
    return raw


def encode_tensor(old: np.ndarray, new: np.ndarray) -> tuple[str, int, bytes] | None:
    """(encoding, changed elements, compressed blob) of new vs old bits; None if equal."""
    if old.shape != new.shape or old.dtype != new.dtype:
        raise CodecError(f"shape/dtype changed: {old.shape} {old.dtype} -> {new.shape} {new.dtype}")
    old, new = old.ravel(), new.ravel()  # (n,)
    moved = old != new  # (n,) bool
    # counted first: the indices of a dense change (most of an AdamW step's elements) are an
    # int64 array 4x the tensor's bf16 bytes, which took 17x the count's time to build
    changed = int(np.count_nonzero(moved))
    if changed == 0:
        return None
    if changed > DENSE_ABOVE * old.size:
        return "xor", changed, _pack(_planes(np.bitwise_xor(old, new)))  # of the (n,) XOR
    # nonzero over a bool mask is ~2.5x faster than over the uint16 XOR itself
    idx = np.flatnonzero(moved)  # (c,)
    if old.size > np.iinfo(np.uint32).max:
        raise CodecError(f"tensor of {old.size} elements: sparse deltas index with uint32")
    gaps = np.diff(idx, prepend=0).astype(np.uint32)  # (c,) first index, then distances >= 1
    x = np.bitwise_xor(old[idx], new[idx])  # (c,)
    return "sparse", changed, _pack(_planes(gaps) + _planes(x))


def decode_tensor(
    enc: str, changed: int, blob, n: int, dtype, deflated: bool = False
) -> tuple[np.ndarray, np.ndarray | None]:
    """(values, indices) of an XOR delta over a tensor of ``n`` elements; indices None means
    dense (values has n elements). ``deflated``: a blob of a ``BRDELTA1`` file."""
    k = np.dtype(dtype).itemsize
    if enc == "xor":
        return _unplanes(_unpack(blob, k * n, deflated), dtype, n), None
    if deflated and enc.startswith("xor_raw"):  # its k lowest planes stored as they are
        stored = int(enc[7:]) if enc[7:].isdigit() else 0
        if not 0 < stored < k:
            raise CodecError(f"unknown encoding {enc!r} for {np.dtype(dtype).name} bits")
        if len(blob) < stored * n:
            raise CodecError(f"delta blob of {len(blob)} bytes holds no {stored} raw planes of {n}")
        rest = _unpack(blob[stored * n :], (k - stored) * n, deflated)
        return _unplanes(bytes(blob[: stored * n]) + rest, dtype, n), None
    if enc != "sparse" or not 0 < changed <= n:
        raise CodecError(f"unknown encoding {enc!r} or count {changed} (of {n})")
    raw = _unpack(blob, (4 + k) * changed, deflated)
    width = 4 * changed
    gaps = _unplanes(raw[:width], np.uint32, changed)
    values = _unplanes(raw[width:], dtype, changed)
    if (gaps[1:] == 0).any():
        raise CodecError("sparse delta repeats an index")
    idx = np.cumsum(gaps, dtype=np.int64)
    if idx[-1] >= n:
        raise CodecError(f"sparse delta index {idx[-1]} beyond {n} elements")
    return values, idx


def xor_into(bits: np.ndarray, values: np.ndarray, idx: np.ndarray | None) -> None:
    """Apply (or undo: XOR is its own inverse) one tensor's decoded delta in place."""
    flat = bits.reshape(-1)  # a view: tensors are kept contiguous
    if idx is None:
        np.bitwise_xor(flat, values, out=flat)
    else:
        flat[idx] ^= values


def encode_delta(old: dict[str, np.ndarray], new: dict[str, np.ndarray]) -> tuple[bytes, int]:
    """The delta file's bytes taking ``old`` to ``new`` (same names and shapes), and the number
    of elements that changed."""
    if old.keys() != new.keys():
        raise CodecError(f"tensor names differ: {sorted(old.keys() ^ new.keys())[:5]}")
    return delta_file(dict(zip(new, parallel_map(lambda n: encode_tensor(old[n], new[n]), new))))


def delta_file(encoded: dict[str, tuple[str, int, bytes] | None]) -> tuple[bytes, int]:
    """The delta file of per-tensor ``encode_tensor`` results (None: unchanged) and the number
    of changed elements. Layout: magic, u64 header length, JSON header, blobs."""
    entries, blobs, offset, changed = {}, [], 0, 0
    for name, coded in encoded.items():
        if coded is None:
            continue
        enc, count, blob = coded
        entries[name] = {"enc": enc, "changed": count, "offset": offset, "length": len(blob)}
        blobs.append(blob)
        offset += len(blob)
        changed += count
    header = json.dumps({"tensors": entries}, separators=(",", ":")).encode()
    return _DELTA_MAGIC + struct.pack("<Q", len(header)) + header + b"".join(blobs), changed


def decode_delta(
    payload: bytes, tensors: dict[str, np.ndarray]
) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """Every changed tensor's (values, indices) from a delta file, checked against the shapes
    of ``tensors`` (the state it applies to) before anything is applied."""
    magic = payload[: len(_DELTA_MAGIC)]
    if magic not in (_DELTA_MAGIC, _DEFLATED_MAGIC):
        raise CodecError("not a brorl delta file (bad magic)")
    start = len(_DELTA_MAGIC) + 8
    try:
        (n,) = struct.unpack("<Q", payload[len(_DELTA_MAGIC) : start])
        entries = json.loads(payload[start : start + n])["tensors"]
    except (struct.error, ValueError, KeyError) as exc:
        raise CodecError(f"delta header unreadable: {exc}") from None
    body = memoryview(payload)[start + n :]
    out = {}
    for name, e in entries.items():
        if name not in tensors:
            raise CodecError(f"delta names tensor {name!r} the state lacks")
        bits = tensors[name]
        blob = body[e["offset"] : e["offset"] + e["length"]]
        out[name] = decode_tensor(
            e["enc"], e["changed"], blob, bits.size, bits.dtype, magic == _DEFLATED_MAGIC
        )
    return out
