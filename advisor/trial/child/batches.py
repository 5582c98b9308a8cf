"""Turn one batch into a loss, following the factory contract (the factory contract, README.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch

from advisor.errors import ContractError

__all__ = [
    "BatchKind",
    "batch_kind",
    "compute_loss",
    "describe_batch",
    "to_channels_last",
    "to_device",
]

BatchKind = Literal["pair", "tuple", "dict", "tensor"]


def batch_kind(batch: Any) -> BatchKind:
    """The batch's form in the factory contract: a pair, a longer tuple, a dict or one tensor."""
    if isinstance(batch, Mapping):
        return "dict"
    if isinstance(batch, (tuple, list)):
        return "pair" if len(batch) == 2 else "tuple"
    return "tensor"


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor in a (nested) batch to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {key: to_device(value, device, non_blocking) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(value, device, non_blocking) for value in batch)
    return batch


def to_channels_last(batch: Any) -> Any:
    """Every 4-D floating-point tensor in a (nested) batch in the channels-last memory format."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 4 and batch.is_floating_point():
            return batch.contiguous(memory_format=torch.channels_last)
        return batch
    if isinstance(batch, Mapping):
        return {key: to_channels_last(value) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_channels_last(value) for value in batch)
    return batch


def compute_loss(model: Callable[..., Any], batch: Any, loss_fn: Callable[..., Any] | None) -> Any:
    """Forward one batch and return the scalar loss tensor."""
    kind = batch_kind(batch)
    if kind == "dict":
        output = model(**batch)
        loss = output if loss_fn is None else loss_fn(output, batch)
    elif loss_fn is None:
        output = model(*batch) if kind != "tensor" else model(batch)
        loss = output
    elif kind == "tensor":
        raise ContractError(
            "a batch is a single tensor but a loss_fn was given: yield (inputs, target) pairs"
        )
    else:
        loss = loss_fn(model(*batch[:-1]), batch[-1])
    return _extract_loss(loss, gathered=isinstance(model, torch.nn.DataParallel))


def _extract_loss(output: Any, *, gathered: bool = False) -> torch.Tensor:
    loss = output
    if isinstance(output, Mapping) and "loss" in output:
        loss = output["loss"]
    elif not isinstance(output, torch.Tensor) and hasattr(output, "loss"):
        loss = output.loss
    if not isinstance(loss, torch.Tensor):
        raise ContractError(
            f"the loss is a {type(output).__name__}; with loss_fn=None the model must return "
            "a scalar tensor, an object with .loss, or a mapping with 'loss'"
        )
    if gathered and loss.ndim == 1:  # DataParallel gathers one scalar loss per GPU
        return loss.mean()
    if loss.ndim != 0:
        raise ContractError(
            f"the loss has shape {tuple(loss.shape)}, not a scalar: reduce it (e.g. .mean())"
        )
    return loss


def describe_batch(batch: Any) -> str:
    """Shapes and dtypes of a collated batch, e.g. `(float32[32, 64], int64[32])`."""
    if isinstance(batch, torch.Tensor):
        return f"{str(batch.dtype).removeprefix('torch.')}{list(batch.shape)}"
    if isinstance(batch, Mapping):
        return "{" + ", ".join(f"{k}: {describe_batch(v)}" for k, v in batch.items()) + "}"
    if isinstance(batch, (tuple, list)):
        return "(" + ", ".join(describe_batch(value) for value in batch) + ")"
    return type(batch).__name__
