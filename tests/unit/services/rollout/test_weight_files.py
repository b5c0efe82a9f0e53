"""Which HF tensors make each engine parameter (services/rollout/weight_files.packed_sources):
the map the in-place reload (services/rollout/reload.py) stacks by."""

from services.rollout.weight_files import packed_sources

QWEN2 = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def test_a_packed_module_takes_its_parts_in_the_mappings_order():
    assert packed_sources("model.layers.3.self_attn.qkv_proj", "weight", QWEN2) == [
        "model.layers.3.self_attn.q_proj.weight",
        "model.layers.3.self_attn.k_proj.weight",
        "model.layers.3.self_attn.v_proj.weight",
    ]
    assert packed_sources("model.layers.0.self_attn.qkv_proj", "bias", QWEN2)[2] == (
        "model.layers.0.self_attn.v_proj.bias"
    )
    assert packed_sources("model.layers.11.mlp.gate_up_proj", "weight", QWEN2) == [
        "model.layers.11.mlp.gate_proj.weight",
        "model.layers.11.mlp.up_proj.weight",
    ]


def test_any_other_parameter_is_its_own_name():
    assert packed_sources("model.layers.0.mlp.down_proj", "weight", QWEN2) == [
        "model.layers.0.mlp.down_proj.weight"
    ]
    assert packed_sources("lm_head", "weight", QWEN2) == ["lm_head.weight"]
    assert packed_sources("model.norm", "weight", {}) == ["model.norm.weight"]
    # a top-level packed module (no parent) and a name that only ends like one
    assert packed_sources("qkv_proj", "weight", QWEN2)[0] == "q_proj.weight"
    assert packed_sources("model.my_qkv_proj", "weight", QWEN2) == ["model.my_qkv_proj.weight"]
