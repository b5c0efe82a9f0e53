"""Publishing weight versions (weight store + Redis pointer) and the final HF export."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Callable

from brorl.v1 import common_pb2
from brorl.weights import WeightStore

log = logging.getLogger(__name__)


def publish_version(
    save_weights: Callable[[Path], None],
    store: WeightStore,
    point: Callable[[common_pb2.WeightVersion], None],
    version: int,
    step: int,
) -> common_pb2.WeightVersion:
    """Write the policy's weights as ``version`` and point the rollout workers at it
    (``point``: e.g. RunChannels.publish_weights)."""
    start = time.perf_counter()
    staging = store.staging_dir(version)
    save_weights(staging)
    pointer = store.commit(version, staging, meta={"step": step})
    point(pointer)
    log.info(
        "published weight version %d (%.1f MB) in %.2fs",
        version,
        pointer.bytes / 1e6,
        time.perf_counter() - start,
    )
    return pointer


_WEIGHT_FILES = {"config.json", "generation_config.json", "model.safetensors.index.json"}


def export_final(model, source_dir: str, out: Path) -> Path:
    """The run's final policy in Hugging Face format. Tokenizer files (and any other metadata)
    are copied byte for byte from the initial model's directory: re-saving through
    AutoTokenizer could substitute the architecture's default tokenizer class."""
    model.save_pretrained(out, safe_serialization=True)
    for f in Path(source_dir).iterdir():
        if f.is_file() and f.suffix not in (".safetensors", ".bin") and f.name not in _WEIGHT_FILES:
            shutil.copy2(f, out / f.name)
    return out
