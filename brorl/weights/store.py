"""The weight store: one directory per published version, visible only when complete.

A producer writes a version's files (safetensors) into a staging directory, then ``commit``
hashes them into ``manifest.json``, writes the ``STABLE`` marker and renames the directory
into place atomically. Readers resolve a WeightVersion pointer (kept in Redis) and call
``verify`` before loading. The store never imports torch: it moves and checks files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from brorl.errors import FailedPrecondition
from brorl.v1 import common_pb2

MANIFEST = "manifest.json"
STABLE = "STABLE"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class WeightStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def version_dir(self, version: int) -> Path:
        return self.root / f"v{version:08d}"

    def staging_dir(self, version: int) -> Path:
        path = self.root / f".staging-v{version:08d}-{os.getpid()}"
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def commit(
        self,
        version: int,
        staging: Path,
        kind: str = "full",
        base_version: int = 0,
        meta: dict | None = None,
        serving: dict | None = None,
    ) -> common_pb2.WeightVersion:
        """Hash the staged files, write manifest + STABLE and move the version into place.
        ``serving``: the serving-dtype description of a keyframe/delta version (dtype, keyframe,
        base manifest sha256, every reconstructed tensor's sha256; brorl.weights.chain)."""
        files = {
            p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
            for p in sorted(staging.iterdir())
            if p.is_file()
        }
        if not files:
            raise FailedPrecondition(f"staging directory {staging} holds no files")
        manifest = {
            "version": version,
            "kind": kind,
            "base_version": base_version,
            "files": files,
            "meta": meta or {},
            "created": time.time(),
        }
        if serving is not None:
            manifest["serving"] = serving
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        digest = sha256_file(staging / MANIFEST)
        (staging / STABLE).write_text(digest)
        final = self.version_dir(version)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        return common_pb2.WeightVersion(
            version=version,
            uri=str(final.resolve()),
            sha256=digest,
            kind=kind,
            base_version=base_version,
            created_ms=int(manifest["created"] * 1000),
            bytes=sum(f["bytes"] for f in files.values()),
        )

    @staticmethod
    def verify(pointer: common_pb2.WeightVersion) -> Path:
        """Return the version's directory after checking marker, manifest hash and every file."""
        path = Path(pointer.uri)
        verify_dir(path, pointer.version, pointer.sha256)
        return path

    def prune(self, keep: int) -> None:
        """Delete all but the newest ``keep`` complete versions, except the live delta chain:
        the newest keyframe at or below the newest version and every version after it stay,
        so a worker can always rebuild the newest version (docs/weights.md)."""
        versions = sorted(p for p in self.root.glob("v*") if (p / STABLE).exists())
        if not versions or keep <= 0:
            return
        live = len(versions)
        for i in range(len(versions) - 1, -1, -1):
            live = i
            if _kind(versions[i]) != "delta":
                break  # a full version: nothing before it is needed
        # max(0, ...): with fewer than ``keep`` versions a negative bound would slice off all but
        # the newest, keyframe included, leaving a chain no new worker can rebuild.
        for old in versions[: max(0, min(len(versions) - keep, live))]:
            shutil.rmtree(old, ignore_errors=True)


def _kind(path: Path) -> str:
    try:
        return json.loads((path / MANIFEST).read_text()).get("kind", "full")
    except (OSError, ValueError):
        return "full"  # unreadable: not part of a chain anyone can use


def verify_dir(path: Path, version: int, sha256: str = "", read: dict | None = None) -> dict:
    """Check a version directory: STABLE marker, manifest hash (== ``sha256`` when given, else
    == the marker's content: a version verifies itself without its pointer) and every file's
    hash. Returns the manifest. Files named in ``read`` are read whole and their checked bytes
    stored there (each file is read once)."""
    if not (path / STABLE).is_file():
        raise FailedPrecondition(
            f"weight version {version} at {path} is not complete (no STABLE marker)"
        )
    digest = sha256_file(path / MANIFEST)
    expected = sha256 or (path / STABLE).read_text().strip()
    if digest != expected:
        raise FailedPrecondition(
            f"weight version {version}: manifest sha256 {digest} != "
            f"{'pointer' if sha256 else 'STABLE marker'} {expected}"
        )
    manifest = json.loads((path / MANIFEST).read_text())
    for name, info in manifest["files"].items():
        if not (path / name).exists():
            raise FailedPrecondition(f"weight version {version}: file {name} is missing")
        if read is not None and name in read:
            read[name] = (path / name).read_bytes()
            digest = hashlib.sha256(read[name]).hexdigest()
        else:
            digest = sha256_file(path / name)
        if digest != info["sha256"]:
            raise FailedPrecondition(f"weight version {version}: file {name} is corrupt")
    return manifest
