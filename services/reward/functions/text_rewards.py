"""Text rewards used alone or as composite components: relevance, safety, diversity.

* relevance — cosine similarity between the prompt (question) and the completion (answer). With
  ``model_path`` it uses a local transformers encoder (mean-pooled last hidden states). Without
  one — the default, as no embedding model ships with brorl and nothing is downloaded — it is the
  cosine of bag-of-character-n-gram counts: a lexical-overlap score, not a semantic one.
* safety — 1 - toxicity, where toxicity comes from a small weighted word lexicon (not a classifier);
  any sensitive word or phrase makes it 0.
* diversity — normalised entropy of the completion's n-grams: 1 when no n-gram repeats, near 0 for
  degenerate repetition.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter

from services.reward.base import Score, ScoreItem
from services.reward.config import BUILTIN_FUNCTIONS, DiversitySpec, RelevanceSpec, SafetySpec

DEFAULT_SENSITIVE = [
    "kill yourself",
    "make a bomb",
    "build a bomb",
    "credit card number",
    "social security number",
    "nerve agent",
    "child pornography",
]
DEFAULT_TOXICITY = {
    "idiot": 0.6,
    "stupid": 0.4,
    "moron": 0.6,
    "dumb": 0.3,
    "loser": 0.4,
    "pathetic": 0.4,
    "worthless": 0.5,
    "hate": 0.3,
    "shut up": 0.4,
    "disgusting": 0.4,
    "scum": 0.6,
    "trash": 0.3,
    "fuck": 0.7,
    "fucking": 0.7,
    "shit": 0.5,
    "bitch": 0.7,
    "bastard": 0.6,
    "asshole": 0.7,
    "damn": 0.2,
    "crap": 0.2,
    "die": 0.3,
    "kill": 0.4,
}
_WORD = re.compile(r"\w+", re.UNICODE)


def _phrase_pattern(words) -> re.Pattern | None:
    words = [w.strip() for w in words if w.strip()]
    if not words:
        return None
    alts = sorted(
        (r"\s+".join(re.escape(part) for part in w.split()) for w in words), key=len, reverse=True
    )
    return re.compile(r"(?<!\w)(?:" + "|".join(alts) + r")(?!\w)", re.IGNORECASE)


def char_ngrams(text: str, n: int) -> Counter:
    s = " ".join(text.lower().split())
    if len(s) < n:
        return Counter([s]) if s else Counter()
    return Counter(s[i : i + n] for i in range(len(s) - n + 1))


def cosine(a: Counter, b: Counter) -> float:
    if not a or not b:
        return 0.0
    dot = sum(v * b.get(k, 0) for k, v in a.items())
    return dot / (
        math.sqrt(sum(v * v for v in a.values())) * math.sqrt(sum(v * v for v in b.values()))
    )


class Relevance:
    description = BUILTIN_FUNCTIONS["relevance"].description

    def __init__(self, name: str = "relevance", spec: RelevanceSpec | None = None):
        self.name, self.spec = name, spec or RelevanceSpec()
        self._model = self._tok = None
        self._lock = threading.Lock()

    def warm(self) -> None:
        if self.spec.model_path:
            self._load()

    def _load(self):
        with self._lock:
            if self._model is None:
                from transformers import AutoModel, AutoTokenizer

                tok = AutoTokenizer.from_pretrained(self.spec.model_path)
                if tok.pad_token is None:
                    tok.pad_token = tok.eos_token or tok.unk_token
                self._model = AutoModel.from_pretrained(self.spec.model_path).eval()
                self._tok = tok
        return self._model, self._tok

    def _embed(self, texts: list[str]):
        import torch

        model, tok = self._load()
        out = []
        with torch.no_grad():
            for i in range(0, len(texts), self.spec.batch_size):
                enc = tok(
                    texts[i : i + self.spec.batch_size],
                    padding=True,
                    truncation=True,
                    max_length=self.spec.max_length,
                    return_tensors="pt",
                )
                hidden = model(**enc).last_hidden_state  # (B, T, H)
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B, H)
                out.append(torch.nn.functional.normalize(pooled, dim=-1))
        return torch.cat(out)

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        if not self.spec.model_path:
            n = self.spec.ngram
            return [
                Score(
                    cosine(char_ngrams(i.prompt, n), char_ngrams(i.completion, n)),
                    components={"method_ngram": 1.0},
                )
                for i in items
            ]
        q = self._embed([i.prompt for i in items])
        a = self._embed([i.completion for i in items])
        return [Score(float(c), components={"method_ngram": 0.0}) for c in (q * a).sum(-1).tolist()]


class Safety:
    description = BUILTIN_FUNCTIONS["safety"].description

    def __init__(self, name: str = "safety", spec: SafetySpec | None = None):
        self.name, self.spec = name, spec or SafetySpec()
        words = (
            DEFAULT_SENSITIVE if self.spec.sensitive_words is None else self.spec.sensitive_words
        )
        self.sensitive = _phrase_pattern(words)
        lexicon = (
            DEFAULT_TOXICITY if self.spec.toxicity_lexicon is None else self.spec.toxicity_lexicon
        )
        self.lexicon = {k.lower(): v for k, v in lexicon.items()}
        self.toxic = _phrase_pattern(self.lexicon)

    def sensitive_hit(self, text: str) -> str | None:
        m = self.sensitive.search(text) if self.sensitive else None
        return m.group(0) if m else None

    def toxicity(self, text: str) -> float:
        if not self.toxic:
            return 0.0
        total = sum(
            self.lexicon.get(" ".join(m.group(0).lower().split()), 0.0)
            for m in self.toxic.finditer(text)
        )
        return min(1.0, total / self.spec.toxicity_scale)

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        out = []
        for item in items:
            tox = self.toxicity(item.completion)
            hit = self.sensitive_hit(item.completion)
            comps = {"toxicity": tox, "sensitive": float(hit is not None)}
            if hit:
                out.append(Score(0.0, detail=f"sensitive phrase {hit!r}", components=comps))
            else:
                out.append(Score(1.0 - tox, components=comps))
        return out


def ngram_entropy(text: str, n: int, unit: str = "word") -> tuple[float, float, int]:
    """(normalised entropy in [0, 1], distinct-n ratio, n-gram count) of ``text``."""
    tokens = _WORD.findall(text.lower()) if unit == "word" else list(" ".join(text.split()))
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if len(grams) < 2:
        return 0.0, float(bool(grams)), len(grams)
    counts = Counter(grams)
    total = len(grams)
    entropy = -sum(c / total * math.log(c / total) for c in counts.values())
    return entropy / math.log(total), len(counts) / total, total


class Diversity:
    description = BUILTIN_FUNCTIONS["diversity"].description

    def __init__(self, name: str = "diversity", spec: DiversitySpec | None = None):
        self.name, self.spec = name, spec or DiversitySpec()

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        out = []
        for item in items:
            ent, distinct, count = ngram_entropy(item.completion, self.spec.n, self.spec.unit)
            out.append(
                Score(
                    ent,
                    components={"distinct": distinct, "ngrams": float(count)},
                    detail="" if count >= 2 else f"fewer than 2 {self.spec.n}-grams",
                )
            )
        return out
