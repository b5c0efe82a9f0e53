"""demo/long_shape.py: the realistic shape is what its docstring says — a model of at least
20 M parameters, prompts of at least 128 tokens that the tokenizer knows entirely, a
continuous reward configured, completions allowed 32 tokens or more, a learner forward in bf16
only where its CPU multiplies bf16 natively."""

import json

from transformers import AutoModelForCausalLM, AutoTokenizer

from demo import long_shape
from brorl.apps import recipe
from brorl.apps.demo_cmd import DemoConfig


def test_the_long_shape_is_long_and_large(tmp_path):
    model, data = long_shape.make_inputs(tmp_path, n_prompts=20)
    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model).parameters())
    assert params >= 20_000_000
    tok = AutoTokenizer.from_pretrained(model)
    rows = data.read_text().splitlines()
    assert len(rows) == 20
    for row in map(json.loads, rows):
        ids = tok(row["prompt"])["input_ids"]
        assert len(ids) >= 128 and tok.unk_token_id not in ids
    assert long_shape.MAX_TOKENS >= 32
    cfg = recipe.load_recipe(DemoConfig, recipe.CONFIGS / "demo.yaml", long_shape.OVERRIDES)
    assert cfg.run["reward_fn"] == "relevance"
    assert cfg.reward["functions"]["relevance"]["type"] == "relevance"
    # bf16 only where the learner's CPU has it: emulated bf16 made a step take minutes
    assert cfg.run["train"]["autocast"] == "native"
    # a second call reuses the model it made
    before = (model / "model.safetensors").stat().st_mtime_ns
    long_shape.make_inputs(tmp_path, n_prompts=5)
    assert (model / "model.safetensors").stat().st_mtime_ns == before
