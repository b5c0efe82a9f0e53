"""Reward model: generate a preference set, train briefly on CPU, serve it by name through gRPC.

The full measurement (≥ 90% validation pairwise accuracy within 5 minutes) is
``python -m services.reward.training.rm_train --generate 20000 --data D/prefs.jsonl --out D/model``;
this test is a shortened run (1500 steps, ~1/4 of the full run) that must still clearly beat chance
(0.5).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from brorl.v1 import reward_pb2
from services.reward.training.prefgen import generate
from services.reward.training.rm_train import pair_metrics, split_pairs

from .conftest import reward_server

ROOT = Path(__file__).resolve().parents[2]


def test_pair_metrics_accuracy_and_calibration():
    m = pair_metrics([3.0, 2.0, -1.0, 0.5])
    assert m["accuracy"] == 0.75 and 0 <= m["ece"] <= 1
    assert pair_metrics([20.0] * 10)["ece"] == pytest.approx(0.0, abs=1e-6)  # sure and right
    assert pair_metrics([20.0, -20.0])["ece"] == pytest.approx(0.5, abs=1e-6)  # sure, half wrong


def test_generated_pairs_and_prompt_level_split():
    pairs = generate(2000, seed=3)
    assert all(p["chosen"] == str(eval(p["prompt"][:-1])) != p["rejected"] for p in pairs)  # noqa: S307 - our data
    train, val = split_pairs(pairs, 0.1, 0)
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in val}
    assert 0.05 < len(val) / len(pairs) < 0.15


@pytest.mark.slow
def test_train_then_serve_reward_model(tmp_path):
    data, out = tmp_path / "prefs.jsonl", tmp_path / "rm"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.reward.training.rm_train",
            "--generate",
            "20000",
            "--data",
            str(data),
            "--out",
            str(out),
            "--steps",
            "600",
            "--max-seconds",
            "300",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert metrics["val_pairs"] > 1000 and metrics["train_pairs"] > 15000
    # A short run (the ≥ 90% acceptance run is `brorl rm train` with the defaults): 600 steps
    # reach ~0.68 on 2,053 validation pairs; chance is 0.5.
    assert metrics["val_accuracy"] >= 0.62, metrics
    assert 0 <= metrics["val_ece"] < 0.2
    assert (out / "config.json").is_file() and (out / "brorl_rm.json").is_file()

    from services.reward.config import RewardServiceConfig

    cfg = RewardServiceConfig(
        bind="127.0.0.1:0",
        functions={
            "arith_rm": {"type": "reward_model", "path": str(out), "batch_size": 16},
            "arith_gated": {
                "type": "pipeline",
                "gates": {"format": 1.0},
                "scorer": "arith_rm",
                "clip": 3.0,
            },
        },
    )
    with reward_server(cfg) as (server, stub):
        server.registry.warm()
        pairs = generate(200, seed=99)
        items = [
            reward_pb2.ScoreRequest(id=f"{i}{side}", prompt=p["prompt"], completion=p[side])
            for i, p in enumerate(pairs)
            for side in ("chosen", "rejected")
        ]
        resp = stub.ScoreBatch(
            reward_pb2.ScoreBatchRequest(reward_fn="arith_rm", items=items), timeout=60
        )
        assert all(r.status == "ok" and "rm_raw" in r.components for r in resp.results)
        raw = [r.components["rm_raw"] for r in resp.results]
        wins = sum(raw[2 * i] > raw[2 * i + 1] for i in range(len(pairs)))
        assert wins / len(pairs) >= 0.6, wins
        gated = stub.ScoreBatch(
            reward_pb2.ScoreBatchRequest(
                reward_fn="arith_gated",
                items=[
                    reward_pb2.ScoreRequest(id="a", prompt="12+35=", completion="47"),
                    reward_pb2.ScoreRequest(id="b", prompt="12+35=", completion="forty-seven"),
                ],
            ),
            timeout=30,
        ).results
        assert gated[0].components["exit_stage"] == 3 and -3 <= gated[0].reward <= 3
        assert gated[1].components["exit_stage"] == 2 and gated[1].reward == 0


def test_backbone_option_fine_tunes_a_local_model(tmp_path, capsys):
    from demo.model import create_tiny_model
    from services.reward.training import prefgen, rm_train

    backbone = create_tiny_model(
        tmp_path / "lm", hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64
    )
    prefgen.write_jsonl(prefgen.generate(200, seed=1), tmp_path / "p.jsonl")
    assert (
        rm_train.main(
            [
                "--data",
                str(tmp_path / "p.jsonl"),
                "--out",
                str(tmp_path / "rm"),
                "--backbone",
                str(backbone),
                "--steps",
                "5",
                "--batch-size",
                "8",
            ]
        )
        == 0
    )
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["steps"] == 5 and 0 <= metrics["val_accuracy"] <= 1
    assert (
        rm_train.main(["--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x")])
        == 2
    )


def test_the_datas_own_margins_are_used_by_default(tmp_path):
    from services.reward.training.rm_train import load_pairs, pair_margins

    rows = [{"prompt": "p", "chosen": "a", "rejected": "b", "margin": i % 3} for i in range(9)]
    rows.append({"prompt": "q", "chosen": "a", "rejected": "b"})  # no margin: the default
    path = tmp_path / "prefs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = load_pairs(path)
    assert pair_margins(pairs, 0.5, 2.0, True) == [0.0, 2.0, 4.0] * 3 + [0.5]
    assert pair_margins(pairs, 0.5, 2.0, False) == [0.5] * 10
    rows[0]["margin"] = "big"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="1: margin must be a finite number"):
        load_pairs(path)
