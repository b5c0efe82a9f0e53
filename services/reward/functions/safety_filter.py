"""The safety filter stage of a reward pipeline: what is checked before any reward is computed.

A completion is filtered — its reward is the pipeline's ``filtered_reward`` penalty, status
"filtered", and it is never scored — for the first of these reasons that holds:

  too_long    longer than ``filter_max_chars`` characters
  word        a ``sensitive_words`` entry appears as a whole word (case-insensitive)
  regex       a ``filter_regex`` pattern matches somewhere
  classifier  a local sequence-classification model (``classifier.path``) gives its
              ``unsafe_label`` a softmax probability >= ``classifier.threshold``

The reason travels with the path as the reward component ``filtered/<reason>`` (1.0), which the
learner counts (``reward/filtered/<reason>``). The cheap checks run first; the classifier sees,
batched, only the completions they let through. The whole completion is checked, also past the
pipeline's ``max_chars`` truncation.
"""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path

from brorl.errors import InvalidArgument
from services.reward.functions.text_rewards import _phrase_pattern
from services.reward.pipeline_config import PipelineSpec

log = logging.getLogger(__name__)
REASONS = ("too_long", "word", "regex", "classifier")


class SafetyFilter:
    def __init__(self, name: str, spec: PipelineSpec):
        self.spec = spec
        self.sensitive = _phrase_pattern(spec.sensitive_words)
        self.patterns = [re.compile(p) for p in spec.filter_regex]
        self.classifier = None
        if spec.classifier is not None:
            self.classifier = SafetyClassifier(name, spec.classifier)

    def warm(self) -> None:
        if self.classifier is not None:
            self.classifier.load()

    def check(self, texts: list[str]) -> list[tuple[str, str] | None]:
        """(reason, detail) for each filtered text, None for the others."""
        out = [self._cheap(t) for t in texts]
        if self.classifier is not None:
            rest = [i for i, v in enumerate(out) if v is None]
            probs = self.classifier.unsafe_probabilities([texts[i] for i in rest])
            for i, p in zip(rest, probs):
                if p >= self.classifier.spec.threshold:
                    out[i] = ("classifier", f"classifier: unsafe with probability {p:.3f}")
        return out

    def _cheap(self, text: str) -> tuple[str, str] | None:
        s = self.spec
        if s.filter_max_chars and len(text) > s.filter_max_chars:
            return "too_long", f"{len(text)} characters > filter_max_chars={s.filter_max_chars}"
        hit = self.sensitive.search(text) if self.sensitive else None
        if hit:
            return "word", f"sensitive word {hit.group(0)!r}"
        for pattern in self.patterns:
            if pattern.search(text):
                return "regex", f"matches filter_regex {pattern.pattern!r}"
        return None


class SafetyClassifier:
    """A local Hugging Face sequence-classification model, loaded once (lazily, or by warm)."""

    def __init__(self, name: str, spec):
        self.spec = spec
        if not (Path(spec.path) / "config.json").is_file():
            raise InvalidArgument(
                f"functions.{name}.classifier.path",
                f"{spec.path} holds no model (no config.json): give a local "
                "sequence-classification model directory",
            )
        self._model = self._tok = None
        self._lock = threading.Lock()

    def load(self):
        with self._lock:
            if self._model is None:
                from transformers import AutoModelForSequenceClassification, AutoTokenizer

                tok = AutoTokenizer.from_pretrained(self.spec.path)
                model = AutoModelForSequenceClassification.from_pretrained(self.spec.path).eval()
                labels = model.config.num_labels
                if not self.spec.unsafe_label < labels:
                    raise ValueError(
                        f"{self.spec.path}: unsafe_label {self.spec.unsafe_label} but the model "
                        f"has {labels} labels"
                    )
                if tok.pad_token is None:
                    tok.pad_token = tok.eos_token or tok.unk_token
                model.config.pad_token_id = tok.pad_token_id
                self._model, self._tok = model, tok
                log.info("safety classifier loaded from %s", self.spec.path)
        return self._model, self._tok

    def unsafe_probabilities(self, texts: list[str]) -> list[float]:
        if not texts:
            return []
        import torch

        model, tok = self.load()
        out: list[float] = []
        with torch.no_grad():
            for start in range(0, len(texts), self.spec.batch_size):
                batch = tok(
                    texts[start : start + self.spec.batch_size],
                    padding=True,
                    truncation=True,
                    max_length=self.spec.max_length,
                    return_tensors="pt",
                )
                logits = model(**batch).logits  # (B, labels)
                probs = torch.softmax(logits.double(), dim=-1)[:, self.spec.unsafe_label]
                out += probs.tolist()
        return out
