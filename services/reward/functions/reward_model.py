"""Serve a trained reward model by name: batched forward passes of a sequence-scoring transformers
model.

The directory is one written by ``python -m services.reward.training.rm_train`` (or any
``AutoModelForSequenceClassification`` with one label). Its ``brorl_rm.json``, when present,
supplies the template and whether EOS is appended, so serving formats text exactly as training did.
reward = scale * (raw score - offset); the raw score is also returned as component ``rm_raw``.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from brorl.errors import InvalidArgument
from services.reward.base import Score, ScoreItem
from services.reward.config import RewardModelSpec
from services.reward.functions.rm_format import META_FILE, encode, fill_template

log = logging.getLogger(__name__)


class RewardModel:
    def __init__(self, name: str, spec: RewardModelSpec):
        self.name, self.spec = name, spec
        path = Path(spec.path)
        if not (path / "config.json").is_file():
            raise InvalidArgument(
                f"functions.{name}.path",
                f"{path} holds no model (no config.json); train one "
                "with python -m services.reward.training.rm_train",
            )
        meta = json.loads((path / META_FILE).read_text()) if (path / META_FILE).is_file() else {}
        default = (
            spec.template == "{prompt}{completion}"
        )  # a template set in config wins over the trained one
        self.template = meta.get("template", spec.template) if default else spec.template
        self.append_eos = bool(meta.get("append_eos", False))
        self.metrics = meta.get("metrics", {})
        self.description = f"Reward model at {path} (batched, {spec.batch_size} per pass)."
        self._model = self._tok = None
        self._lock = threading.Lock()

    def warm(self) -> None:
        self._load()

    def _load(self):
        if self._model is None:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            if self.spec.threads:
                torch.set_num_threads(self.spec.threads)
            tok = AutoTokenizer.from_pretrained(self.spec.path)
            model = AutoModelForSequenceClassification.from_pretrained(self.spec.path).eval()
            if model.config.num_labels != 1:
                raise ValueError(
                    f"{self.spec.path}: model has {model.config.num_labels} labels; "
                    "a reward model has 1"
                )
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token or tok.unk_token
            model.config.pad_token_id = tok.pad_token_id
            self._model, self._tok = model, tok
            log.info(
                "reward model %s loaded from %s (validation metrics %s)",
                self.name,
                self.spec.path,
                self.metrics,
            )
        return self._model, self._tok

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        import torch

        texts = [fill_template(self.template, i.prompt, i.completion) for i in items]
        order = sorted(
            range(len(texts)), key=lambda k: len(texts[k])
        )  # similar lengths share a batch
        raw = [0.0] * len(texts)
        with self._lock:
            model, _ = self._load()
            with torch.no_grad():
                for start in range(0, len(order), self.spec.batch_size):
                    idx = order[start : start + self.spec.batch_size]
                    ids, mask = encode(
                        self._tok, [texts[k] for k in idx], self.spec.max_length, self.append_eos
                    )
                    for k, v in zip(
                        idx, model(input_ids=ids, attention_mask=mask).logits[:, 0].tolist()
                    ):
                        raw[k] = v
        s = self.spec
        return [Score(s.scale * (r - s.offset), components={"rm_raw": r}) for r in raw]
