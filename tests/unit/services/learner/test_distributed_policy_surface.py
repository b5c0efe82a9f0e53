"""DistributedPolicy stands for Policy when the learner has several ranks: every method or
property of Policy that the learner's code uses on its policy must exist on it too (a missing
one fails only a multi-rank run, at its first use)."""

from __future__ import annotations

import re
from pathlib import Path

from services.learner.model.policy import Policy
from services.learner.ranks import DistributedPolicy

LEARNER = Path(__file__).resolve().parents[4] / "services" / "learner"


def names_used_on_a_policy() -> set[str]:
    """``policy.<name>`` read or called anywhere under services/learner (not assigned)."""
    names: set[str] = set()
    for path in LEARNER.rglob("*.py"):
        for m in re.finditer(r"\bpolicy\.([A-Za-z_]\w*)\b(?!\s*=[^=])", path.read_text()):
            names.add(m.group(1))
    return names


def test_the_distributed_policy_offers_what_the_learner_uses():
    used = {n for n in names_used_on_a_policy() if hasattr(Policy, n)}
    assert {"update", "weights", "warm_forward", "save_checkpoint"} <= used  # the scan sees them
    assert sorted(n for n in used if not hasattr(DistributedPolicy, n)) == []
