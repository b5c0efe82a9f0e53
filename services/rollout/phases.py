"""Where a generate() call's time went inside vLLM, from its per-request timestamps."""

from __future__ import annotations


def phase_seconds(outputs) -> dict[str, float]:
    """Queue, prefill and decode seconds of one generate() call, from vLLM's per-request
    engine-core timestamps: queued → scheduled (waiting), scheduled → first token (prefill:
    the paths of a group are scheduled together, so their prompt passes share that step), first
    → last token (decode). Over the call's requests: earliest start, latest end. Empty when the
    engine keeps no stats."""
    stats = [getattr(o, "metrics", None) for o in outputs]
    stats = [m for m in stats if m is not None and getattr(m, "first_token_ts", 0.0) > 0]
    if not stats:
        return {}
    queued = min(m.queued_ts for m in stats)
    scheduled = min(m.scheduled_ts for m in stats)
    first = max(m.first_token_ts for m in stats)
    last = max(m.last_token_ts for m in stats)
    return {
        "rollout/queue_s": max(scheduled - queued, 0.0),
        "rollout/prefill_s": max(first - scheduled, 0.0),
        "rollout/decode_s": max(last - first, 0.0),
    }
