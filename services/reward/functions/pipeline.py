"""Hierarchical evaluation with early exit: safety filters, then cheap checks, then one expensive
scorer.

Order, per path:
  1. safety filters (safety_filter.py: length, word list, regexes, a local classifier) — a
     filtered path gets status "filtered", reward ``filtered_reward`` and the component
     ``filtered/<reason>``; nothing else runs. Then the completion is truncated to ``max_chars``.
  2. rules — ``min_chars``, ``max_chars_rule``, ``require_regex``, ``forbid_regex``; the first that
     fails ends the path with ``fail_reward`` (status ok, detail "early exit ...").
  3. gates — cheap registry functions in order (e.g. ``format: 1.0``); a reward below the minimum
     (or a status other than ok) ends the path the same way.
  4. scorer — the expensive function (reward model, judge, code, composite), called once, batched,
     for the paths still standing; its reward is clipped to ±``clip``.
Components record every gate's reward (``gate/<name>``), the scorer's components, ``truncated`` and
``exit_stage`` (0 filtered, 1 rules, 2 gates, 3 scored).
"""

from __future__ import annotations

import re

from brorl.contract import RewardStatus
from services.reward.base import Score, ScoreItem
from services.reward.functions.safety_filter import SafetyFilter
from services.reward.pipeline_config import PipelineSpec


class Pipeline:
    def __init__(self, name: str, spec: PipelineSpec, registry):
        self.name, self.spec, self.registry = name, spec, registry
        self.filter = SafetyFilter(name, spec)
        self.require = [re.compile(p) for p in spec.require_regex]
        self.forbid = [re.compile(p) for p in spec.forbid_regex]
        gates = ", ".join(f"{g}>={m:g}" for g, m in spec.gates.items()) or "none"
        self.description = (
            f"Filters, rules, gates ({gates}), then {spec.scorer}; clipped to ±{spec.clip:g}."
        )

    def warm(self) -> None:
        self.filter.warm()

    def dependencies(self) -> list[str]:
        return list(self.spec.gates) + [self.spec.scorer]

    def _rule_failure(self, text: str) -> str | None:
        s = self.spec
        if len(text) < s.min_chars:
            return f"shorter than min_chars={s.min_chars}"
        if s.max_chars_rule and len(text) > s.max_chars_rule:
            return f"longer than max_chars_rule={s.max_chars_rule}"
        for pat in self.require:
            if not pat.search(text):
                return f"does not match require_regex {pat.pattern!r}"
        for pat in self.forbid:
            if pat.search(text):
                return f"matches forbid_regex {pat.pattern!r}"
        return None

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        """Stage by stage (module docstring): the safety filter and the rules, the gates, the
        scorer; an item leaves at the first stage it fails, with ``exit_stage`` saying which."""
        out: list[Score | None] = [None] * len(items)
        comps: list[dict[str, float]] = [{} for _ in items]
        latency = [0.0] * len(items)
        alive, work = self._screen(items, out, comps)
        for gate, minimum in self.spec.gates.items():
            if not alive:
                break
            alive, work = self._gate(gate, minimum, alive, work, out, comps, latency)
        s = self.spec
        if alive:
            for i, r in zip(alive, self.registry.score(s.scorer, work)):
                reward = max(-s.clip, min(s.clip, r.reward)) if s.clip else r.reward
                comps[i].update(r.components)
                comps[i][s.scorer] = r.reward
                comps[i]["exit_stage"] = 3.0
                out[i] = Score(
                    reward,
                    status=r.status,
                    detail=r.detail,
                    components=comps[i],
                    latency_ms=latency[i] + r.latency_ms,
                )
        return out  # type: ignore[return-value]

    def _screen(self, items, out, comps) -> tuple[list[int], list[ScoreItem]]:
        """Stages 0 and 1: the safety filter on each whole completion, then the rules on its
        (truncated) text; returns the indices that pass and their items."""
        s = self.spec
        alive: list[int] = []
        work: list[ScoreItem] = []
        verdicts = self.filter.check([item.completion for item in items])  # the whole completion
        for i, (item, verdict) in enumerate(zip(items, verdicts)):
            text = item.completion
            truncated = bool(s.max_chars) and len(text) > s.max_chars
            if truncated:
                text = text[: s.max_chars]
            comps[i]["truncated"] = float(truncated)
            if verdict:
                reason, detail = verdict
                comps[i].update({"exit_stage": 0.0, f"filtered/{reason}": 1.0})
                out[i] = Score(
                    s.filtered_reward,
                    status=RewardStatus.FILTERED,
                    detail=detail,
                    components=comps[i],
                )
                continue
            why = self._rule_failure(text)
            if why:
                comps[i]["exit_stage"] = 1.0
                out[i] = Score(
                    s.fail_reward, detail=f"early exit at rules: {why}", components=comps[i]
                )
                continue
            alive.append(i)
            work.append(ScoreItem(item.id, item.prompt, text, item.reference, item.extra))
        return alive, work

    def _gate(self, gate, minimum, alive, work, out, comps, latency):
        """Stage 2, one gate: items whose gate reward is below ``minimum`` (or failed) leave."""
        survivors, still = [], []
        for i, item, g in zip(alive, work, self.registry.score(gate, work)):
            comps[i][f"gate/{gate}"] = g.reward
            latency[i] += g.latency_ms
            if g.status != RewardStatus.OK or g.reward < minimum:
                comps[i]["exit_stage"] = 2.0
                detail = f"early exit at gate {gate}: " + (
                    f"{g.status}: {g.detail}"
                    if g.status != RewardStatus.OK
                    else f"reward {g.reward:g} < {minimum:g}"
                )
                out[i] = Score(
                    self.spec.fail_reward,
                    status=g.status,
                    detail=detail,
                    components=comps[i],
                    latency_ms=latency[i],
                )
            else:
                survivors.append(i)
                still.append(item)
        return survivors, still
