"""Chains of weight versions: which versions rebuild the newest one, and applying them.

A published version is a keyframe (``kind="full"``, every tensor) or a delta against the
version before it (``kind="delta"``); every manifest's ``serving`` section names the chain's
keyframe, the base version's manifest sha256 (the link), and the sha256 of every tensor after
reconstruction (brorl.weights.codec). ``plan_chain`` + ``verified_steps`` pick and check the
directories on disk (torch-free: the rollout service process runs them); ``ServingState``
applies them and verifies every tensor's hash (the rollout engine holds one).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from brorl.weights import codec
from brorl.errors import FailedPrecondition
from brorl.weights.store import verify_dir

log = logging.getLogger(__name__)


class ChainError(ValueError):
    """A version of a chain that cannot be used: missing, corrupt, unlinked or a hash mismatch.
    ``version`` is the first version that failed."""

    def __init__(self, version: int, reason: str):
        super().__init__(f"weight version {version}: {reason}")
        self.version, self.reason = version, reason


@dataclass(frozen=True)
class Step:
    """One verified version directory of a chain."""

    version: int
    path: str
    manifest: dict
    sha256: str  # of the manifest
    payload: bytes = b""  # a delta's file, read and hash-checked once by the fetch

    @property
    def serving(self) -> dict:
        return self.manifest["serving"]


@dataclass(frozen=True)
class Held:
    """What a worker's serving state holds: (version, manifest sha256, keyframe version) of a
    run; version -1 = nothing reconstructed."""

    run_id: str = ""
    version: int = -1
    sha256: str = ""
    keyframe: int = -1


@dataclass(frozen=True)
class ChainResult:
    """What applying a chain left: the serving state (``held``), the version the model serves
    (``loaded``) and the first version rejected ({"version", "reason"}; None: all applied)."""

    held: Held
    loaded: Held
    error: dict | None = None


def version_path(newest: Path, version: int) -> Path:
    """A sibling version's directory in the same store (brorl.weights.store.WeightStore layout)."""
    return newest.parent / f"v{version:08d}"


def plan_chain(newest: Step, held: Held, run_id: str) -> list[int]:
    """Versions to apply, in order, to reach ``newest``: the deltas after the held version when
    it belongs to the same chain, else the chain's keyframe and every delta after it."""
    v, k = newest.version, newest.serving["keyframe"]
    if newest.manifest["kind"] != "delta":
        return [v]
    if held.run_id == run_id and held.keyframe == k and k <= held.version < v:
        return list(range(held.version + 1, v + 1))
    return list(range(k, v + 1))


def read_step(path: Path, version: int, sha256: str = "", serving: bool = True) -> Step:
    """Verify a version directory (marker, manifest, file hashes) and describe it; a delta's
    file comes along as checked bytes (small: the engine then reads nothing). ``serving``:
    refuse a version without a serving section (a plain Hugging Face directory)."""
    read = {codec.DELTA_FILE: b""}
    try:
        manifest = verify_dir(path, version, sha256, read)
    except (FailedPrecondition, OSError, ValueError) as exc:
        raise ChainError(version, str(exc)) from None
    if serving and "serving" not in manifest:
        raise ChainError(version, "manifest has no serving section (not a keyframe/delta)")
    digest = sha256 or (path / "STABLE").read_text().strip()
    return Step(version, str(path), manifest, digest, read[codec.DELTA_FILE])


def verified_steps(
    newest: Step, versions: list[int], base_sha: str
) -> tuple[list[Step], ChainError | None]:
    """Read and check each version of ``versions`` in order: its files, and its link to the
    previous one (``base_sha``: the held state's manifest sha256 when the chain starts with a
    delta). Returns the verified prefix and the error that ended it (None: all verified)."""
    steps: list[Step] = []
    for u in versions:
        try:
            path = Path(newest.path) if u == newest.version else version_path(Path(newest.path), u)
            step = newest if u == newest.version else read_step(path, u)
            if step.manifest["kind"] == "delta" and step.serving["base_sha256"] != base_sha:
                raise ChainError(u, "its base is not the version before it (broken link)")
        except ChainError as exc:
            return steps, exc
        steps.append(step)
        base_sha = step.sha256
    return steps, None


@dataclass
class ServingState:
    """The reconstructed serving-dtype tensors (bits) of one version, and what it is."""

    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    held: Held = field(default_factory=Held)
    dtype: str = ""

    def clear(self) -> None:
        self.tensors, self.held, self.dtype = {}, Held(), ""

    def apply(self, step: Step, run_id: str, verify: bool) -> None:
        """Apply one version in place. A delta that fails to decode changes nothing; one whose
        hashes do not match (``verify``) is undone (XOR again), so the state stays at its base.
        Either raises ChainError. A keyframe replaces everything."""
        serving = step.serving
        if step.manifest["kind"] == "full":
            try:
                tensors = codec.read_keyframe(
                    Path(step.path) / codec.KEYFRAME_FILE, serving["dtype"]
                )
            except (codec.CodecError, OSError, KeyError, ValueError) as exc:
                raise ChainError(step.version, f"keyframe unreadable: {exc}") from None
            _check_shapes(step, tensors)
            if verify:
                _check_hashes(step, tensors)
            self.tensors, self.dtype = tensors, serving["dtype"]
        else:
            if self.held.sha256 != serving["base_sha256"] or self.dtype != serving["dtype"]:
                raise ChainError(step.version, "the held state is not this delta's base")
            try:
                payload = step.payload or (Path(step.path) / codec.DELTA_FILE).read_bytes()
                decoded = codec.decode_delta(payload, self.tensors)
            except (codec.CodecError, OSError, KeyError, ValueError) as exc:
                raise ChainError(step.version, f"delta unreadable: {exc}") from None
            for name, (values, idx) in decoded.items():
                codec.xor_into(self.tensors[name], values, idx)
            if verify:
                try:
                    _check_hashes(step, self.tensors)
                except ChainError:
                    for name, (values, idx) in decoded.items():  # undo: back to the base
                        codec.xor_into(self.tensors[name], values, idx)
                    raise
        self.held = Held(run_id, step.version, step.sha256, serving["keyframe"])

    def apply_chain(self, steps: list[Step], run_id: str, careful: bool) -> None:
        """Apply ``steps`` in order. Fast (``careful=False``): hashes checked after the last
        step only; on a mismatch the state is cleared (intermediate versions are unknown) and
        ChainError raised. Careful: every step checked; on a failure the state stays at the
        last version that verified and ChainError names the one that did not."""
        try:
            for i, step in enumerate(steps):
                self.apply(step, run_id, verify=careful or i == len(steps) - 1)
        except ChainError:
            if not careful:
                self.clear()
            raise

    def verify(self, step: Step) -> None:
        _check_hashes(step, self.tensors)


def _check_shapes(step: Step, tensors: dict[str, np.ndarray]) -> None:
    want = step.serving["tensors"]
    if tensors.keys() != want.keys():
        raise ChainError(
            step.version, f"tensor names differ: {sorted(tensors.keys() ^ want.keys())[:5]}"
        )
    for name, bits in tensors.items():
        if list(bits.shape) != list(want[name]["shape"]):
            raise ChainError(step.version, f"tensor {name} has shape {list(bits.shape)}")


def _check_hashes(step: Step, tensors: dict[str, np.ndarray]) -> None:
    want = step.serving["tensors"]
    if tensors.keys() != want.keys():
        raise ChainError(step.version, "tensor names differ from the manifest")
    for name, sha in codec.tensor_hashes(tensors).items():
        if sha != want[name]["sha256"]:
            raise ChainError(step.version, f"tensor {name}: sha256 of the reconstruction differs")


def reconstruct(path: Path) -> ServingState:
    """The serving state of the version in ``path`` (a weight-store directory), rebuilt from its
    chain's keyframe with every step's hashes checked; raises ChainError. For readers that
    are not workers (evaluation of published versions)."""
    path = Path(path)
    version = int(path.name.lstrip("v"))
    newest = read_step(path, version)
    steps, error = verified_steps(newest, plan_chain(newest, Held(), ""), "")
    if error is not None:
        raise error
    state = ServingState()
    state.apply_chain(steps, "", careful=True)
    return state


def export_hf(path: Path, base_dir: Path, out: Path) -> Path:
    """A Hugging Face model directory of the version in ``path``: ``base_dir``'s files (config,
    tokenizer; no weights) and the version's serving weights as float32 safetensors (bf16 values
    become their exact fp32 values). For readers that load a published version as a model."""
    import shutil

    from safetensors.numpy import save_file

    state = reconstruct(Path(path))
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in Path(base_dir).iterdir():
        if f.is_file() and f.suffix not in (".safetensors", ".bin") and f.name != "manifest.json":
            shutil.copy2(f, out / f.name)
    tensors = {n: codec.bits_to_float32(b, state.dtype) for n, b in state.tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
