"""A callback between a model's layers, forward and backward
(services/learner/model/layer_hooks.py): how the learner checks the workers' cores inside a chunk
of its update."""

from __future__ import annotations

import torch
from torch import nn

from services.learner.model.layer_hooks import between_layers, call_between_layers, decoder_layers
from tests.unit.services.learner.tiny_model import tiny_qwen2

IDS = torch.tensor([[1, 5, 7, 9, 3, 2], [1, 4, 4, 8, 2, 6]])  # (2 paths, 6 positions)


def loss_of(model) -> torch.Tensor:
    return model(input_ids=IDS).logits.float().logsumexp(-1).mean()  # (2, 6, V) -> ()


def test_the_layer_stack_is_the_models_decoder_layers():
    model = tiny_qwen2()
    assert decoder_layers(model) is model.model.layers
    assert decoder_layers(nn.Linear(3, 3)) is None


def test_it_is_called_before_each_layer_forward_and_after_each_layers_gradient():
    model = tiny_qwen2()
    layers = len(model.model.layers)
    calls: list[str] = []
    phase = ["forward"]
    handles = call_between_layers(model, lambda: calls.append(phase[0]))
    loss = loss_of(model)
    assert calls == ["forward"] * layers
    phase[0] = "backward"
    loss.backward()
    assert calls == ["forward"] * layers + ["backward"] * layers  # one a layer in the backward
    phase[0] = "no_grad"
    with torch.no_grad():  # no graph: the forward's calls only
        loss_of(model)
    assert calls[2 * layers :] == ["no_grad"] * layers
    assert len(calls) == 3 * layers
    for handle in handles:
        handle.remove()
    loss_of(model).backward()
    assert len(calls) == 3 * layers  # removed: no more calls


def test_the_gradients_are_the_same_with_the_hooks_and_threads_changed_between_layers():
    plain = tiny_qwen2(seed=3)
    loss_of(plain).backward()
    hooked = tiny_qwen2(seed=3)
    threads = torch.get_num_threads()
    flips = iter(range(100))

    def change_threads():  # as CoreBorrowing.refresh does when the workers' cores free up
        torch.set_num_threads(1 + next(flips) % 2)

    try:
        with between_layers(hooked, change_threads):
            loss_of(hooked).backward()
    finally:
        torch.set_num_threads(threads)
    assert next(flips) == 2 * len(hooked.model.layers)  # it ran, forward and backward
    for (name, a), b in zip(plain.named_parameters(), hooked.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_outside_the_block_and_without_a_model_nothing_is_called():
    model = tiny_qwen2()
    calls = []
    with between_layers(model, lambda: calls.append(1)):
        pass
    loss_of(model).backward()
    with between_layers(None, lambda: calls.append(1)):
        loss_of(model).backward()
    assert calls == []
