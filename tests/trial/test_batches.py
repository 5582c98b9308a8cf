import pytest
import torch
from torch import nn

from advisor.errors import ContractError
from advisor.trial.child.batches import batch_kind, compute_loss, describe_batch, to_device


def test_pair_batch_uses_loss_fn_on_model_output():
    model = nn.Linear(3, 2)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    loss = compute_loss(model, (x, y), nn.CrossEntropyLoss())
    assert torch.allclose(loss, nn.functional.cross_entropy(model(x), y))


def test_longer_tuple_feeds_all_but_last_to_the_model():
    def model(a, b):
        return a + b

    loss = compute_loss(model, (torch.ones(2), torch.ones(2), torch.zeros(2)), nn.MSELoss())
    assert loss.item() == pytest.approx(4.0)


def test_dict_batch_with_model_returning_loss_object_or_mapping():
    class Output:
        def __init__(self, loss):
            self.loss = loss

    batch = {"a": torch.tensor(2.0), "b": torch.tensor(3.0)}
    assert compute_loss(lambda a, b: Output(a * b), batch, None).item() == 6.0
    assert compute_loss(lambda a, b: {"loss": a + b}, batch, None).item() == 5.0


def test_model_returning_a_non_scalar_loss_is_named():
    with pytest.raises(ContractError, match=r"shape \(3,\), not a scalar"):
        compute_loss(lambda x: x, torch.ones(3), None)


def test_model_returning_no_loss_is_named():
    with pytest.raises(ContractError, match="with loss_fn=None the model must return"):
        compute_loss(lambda x: "logits", torch.ones(3), None)


def test_single_tensor_batch_with_loss_fn_is_a_contract_error():
    with pytest.raises(ContractError, match=r"yield \(inputs, target\) pairs"):
        compute_loss(nn.Identity(), torch.ones(3), nn.MSELoss())


def test_describe_and_kind_and_to_device():
    batch = {"x": torch.zeros(4, 3), "y": [torch.zeros(4, dtype=torch.int64)]}
    assert describe_batch(batch) == "{x: float32[4, 3], y: (int64[4])}"
    assert batch_kind(batch) == "dict"
    assert batch_kind((1, 2)) == "pair" and batch_kind((1, 2, 3)) == "tuple"
    moved = to_device(batch, torch.device("cpu"))
    assert moved["x"].device.type == "cpu" and isinstance(moved["y"], list)


class _PerReplicaLoss(nn.DataParallel):
    """What DataParallel returns on 2 GPUs for a model that returns its loss: one per GPU."""

    def forward(self, features):
        return torch.stack([self.module(features), self.module(features) + 2])


def test_data_parallel_losses_gathered_per_gpu_are_averaged():
    model = _PerReplicaLoss(_LossOf())
    loss = compute_loss(model, (torch.ones(4, 3),), None)
    assert loss.ndim == 0 and loss.item() == pytest.approx(13.0)  # mean of 12 and 14
    with pytest.raises(ContractError, match=r"the loss has shape \(2,\)"):
        compute_loss(model.forward, (torch.ones(4, 3),), None)  # not DataParallel: a mistake


class _LossOf(nn.Module):
    def forward(self, features):
        return features.sum()
