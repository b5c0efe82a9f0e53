"""LLM-as-judge over an OpenAI-compatible endpoint (POST {base_url}/v1/chat/completions).

The rubric asks for a score in [score_min, score_max] on a final line ``SCORE: <number>``; the
reward is that score scaled to [0, 1]. Timeouts, connection errors, 429 and 5xx are retried with
exponential backoff; a reply without a usable score is status error (never an exception), a request
that keeps timing out is status timeout. Requests run ``concurrency`` at a time.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from brorl.contract import RewardStatus
from services.reward.base import Score, ScoreItem
from services.reward.config import JudgeSpec

DEFAULT_RUBRIC = """You are a strict grader. Judge the RESPONSE to the PROMPT for correctness, \
helpfulness and clarity{ref_hint}.

PROMPT:
{prompt}

RESPONSE:
{completion}
{reference_block}
Give a short justification, then end with a final line of the form "SCORE: <number>", where \
the number is from {min} (worst) to {max} (best)."""

_PLACEHOLDER = re.compile(
    r"\{(ref_hint|reference_block|min|max|reference|prompt|completion|extra\.[A-Za-z0-9_.-]+)\}"
)
_SCORE_LINE = re.compile(r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_JSON_SCORE = re.compile(r"\"score\"\s*:\s*(-?\d+(?:\.\d+)?)")
_OUT_OF = re.compile(r"(-?\d+(?:\.\d+)?)\s*(?:/|out of)\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


def parse_score(text: str, lo: float, hi: float) -> float | None:
    """The judge's score: the last "SCORE: x", a JSON "score", "x/max", or a bare number; None if
    absent or outside [lo, hi]."""
    candidates = _SCORE_LINE.findall(text) or _JSON_SCORE.findall(text)
    if not candidates:
        candidates = [a for a, b in _OUT_OF.findall(text) if float(b) == hi]
    if not candidates and re.fullmatch(r"\s*-?\d+(?:\.\d+)?\s*", text):
        candidates = [text.strip()]
    if not candidates:
        return None
    value = float(candidates[-1])
    return value if lo <= value <= hi else None


class _Retryable(Exception):
    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class LLMJudge:
    description = (
        "LLM-as-judge over an OpenAI-compatible /v1/chat/completions endpoint; rubric score "
        "scaled to [0, 1]."
    )

    def __init__(self, name: str, spec: JudgeSpec):
        self.name, self.spec = name, spec
        base = spec.base_url.rstrip("/")
        self.url = base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
        self.rubric = spec.rubric or DEFAULT_RUBRIC
        self._pool = ThreadPoolExecutor(
            max_workers=spec.concurrency, thread_name_prefix=f"judge-{name}"
        )

    def prompt_for(self, item: ScoreItem) -> str:
        """The rubric with its placeholders filled (plain replacement: other braces are left
        alone); ``{extra.NAME}`` is the prompt's extra data field NAME (data.fields.extra; empty
        when the row has none)."""
        ref = item.reference.strip()
        values = {
            "ref_hint": ", using the REFERENCE answer" if ref else "",
            "reference_block": f"\nREFERENCE:\n{ref}\n" if ref else "",
            "min": f"{self.spec.score_min:g}",
            "max": f"{self.spec.score_max:g}",
            "reference": item.reference,
            "prompt": item.prompt,
            "completion": item.completion,
        }
        values.update({f"extra.{k}": v for k, v in item.extra.items()})
        return _PLACEHOLDER.sub(
            lambda m: values.get(m.group(1), ""), self.rubric
        )  # one pass: values are not re-scanned

    def _post(self, body: bytes) -> dict:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.spec.api_key_env, "") if self.spec.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.spec.timeout_s) as resp:
                raw = resp.read(4 << 20)
        except urllib.error.HTTPError as exc:
            if exc.code == 429 or exc.code >= 500:
                raise _Retryable(RewardStatus.ERROR, f"judge answered HTTP {exc.code}") from None
            raise ValueError(
                f"judge answered HTTP {exc.code}: {exc.read(300).decode(errors='replace')}"
            ) from None
        except (socket.timeout, TimeoutError):
            raise _Retryable(
                RewardStatus.TIMEOUT, f"judge did not answer within {self.spec.timeout_s:g}s"
            ) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (socket.timeout, TimeoutError)):
                raise _Retryable(
                    RewardStatus.TIMEOUT, f"judge did not answer within {self.spec.timeout_s:g}s"
                ) from None
            raise _Retryable(RewardStatus.ERROR, f"judge unreachable: {exc.reason}") from None
        except (ConnectionError, OSError) as exc:
            raise _Retryable(RewardStatus.ERROR, f"judge connection failed: {exc}") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise ValueError(f"judge reply is not JSON: {raw[:200]!r}") from None

    def _one(self, item: ScoreItem) -> Score:
        start = time.perf_counter()
        spec = self.spec
        body = json.dumps(
            {
                "model": spec.model,
                "temperature": spec.temperature,
                "max_tokens": spec.max_tokens,
                "messages": [{"role": "user", "content": self.prompt_for(item)}],
            }
        ).encode()
        status, detail = RewardStatus.ERROR, "judge not called"
        for attempt in range(spec.retries + 1):
            if attempt:
                time.sleep(spec.backoff_s * 2 ** (attempt - 1))
            try:
                reply = self._post(body)
            except _Retryable as exc:
                status, detail = (
                    exc.status,
                    f"{exc.detail} (attempt {attempt + 1}/{spec.retries + 1})",
                )
                continue
            except ValueError as exc:
                status, detail = RewardStatus.ERROR, str(exc)
                break
            try:
                text = reply["choices"][0]["message"]["content"]
                if not isinstance(text, str):
                    raise TypeError("content is not a string")
            except (KeyError, IndexError, TypeError) as exc:
                status, detail = (
                    RewardStatus.ERROR,
                    f"judge reply has no choices[0].message.content ({exc!r})",
                )
                break
            value = parse_score(text, spec.score_min, spec.score_max)
            ms = (time.perf_counter() - start) * 1000
            if value is None:
                span = f"[{spec.score_min:g}, {spec.score_max:g}]"
                return Score(
                    0.0,
                    status=RewardStatus.ERROR,
                    latency_ms=ms,
                    detail=f"judge reply has no score in {span}: {text[:160]!r}",
                )
            return Score(
                (value - spec.score_min) / (spec.score_max - spec.score_min),
                components={"judge_score": value, "attempts": float(attempt + 1)},
                latency_ms=ms,
            )
        return Score(
            0.0, status=status, detail=detail, latency_ms=(time.perf_counter() - start) * 1000
        )

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        return list(self._pool.map(self._one, items))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
