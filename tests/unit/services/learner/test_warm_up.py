"""The learner service pays its one-time costs before it serves (server.warm_up): transformers'
model classes and DeepSpeed imported, and one rank's process group up, so the first run's
policy is built without them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]

PROBE = """
import sys, torch.distributed as dist
from services.learner.server import warm_up
seconds = warm_up(one_rank={one_rank})
print(seconds >= 0, "transformers.models.auto.modeling_auto" in sys.modules,
      "deepspeed" in sys.modules, dist.is_initialized())
"""


def probe(one_rank: bool) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(one_rank=one_rank)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()[-4:]


def test_one_rank_warms_imports_and_its_process_group():
    assert probe(one_rank=True) == ["True", "True", "True", "True"]


def test_several_ranks_leave_the_group_to_their_first_run():
    # DeepSpeed is imported by init_distributed, after it has chosen the accelerator
    assert probe(one_rank=False) == ["True", "True", "False", "False"]
