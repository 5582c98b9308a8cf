"""A small GPT-2 from Hugging Face transformers, on synthetic token sequences.

    pip install -e ".[integrations]"
    advisor tune examples/hf_gpt2.py:factory

The model is built from a `GPT2Config` (nothing is downloaded). Batches are dicts of
`input_ids` and `labels`, and the model returns its own loss (`.loss`), as with the Hugging Face
`Trainer`. advisor writes `exports/hf_training_args.json` beside the recommendation: the
`TrainingArguments` keywords that apply it.
"""

from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel

from advisor import TrainingTask

VOCAB = 512
CONTEXT = 64
SEQUENCES = 4096


class MarkovTokens(Dataset):
    """Token sequences drawn from a fixed random Markov chain: a next-token task a small model
    learns, with a loss floor it can approach. Deterministic: the same sequences every time."""

    def __init__(self, sequences: int = SEQUENCES, seed: int = 0, context: int = CONTEXT) -> None:
        generator = torch.Generator().manual_seed(seed)
        # Each token has 4 likely successors: about 2 bits of entropy per step.
        successors = torch.randint(VOCAB, (VOCAB, 4), generator=generator)
        tokens = torch.empty(sequences, context, dtype=torch.long)
        tokens[:, 0] = torch.randint(VOCAB, (sequences,), generator=generator)
        for position in range(1, context):
            choice = torch.randint(4, (sequences,), generator=generator)
            tokens[:, position] = successors[tokens[:, position - 1], choice]
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sequence = self.tokens[index]
        return {"input_ids": sequence, "labels": sequence}  # the model shifts the labels


def gpt2(layers: int = 2, context: int = CONTEXT, **config: Any) -> GPT2LMHeadModel:
    """A GPT-2 of `layers` blocks, 128 wide, over `context` tokens, without dropout."""
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB,
            n_positions=context,
            n_embd=128,
            n_layer=layers,
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **config,
        )
    )


def factory() -> TrainingTask:
    return TrainingTask(
        model=gpt2(),
        dataset=MarkovTokens(),
        loss_fn=None,  # GPT2LMHeadModel returns .loss when given labels
        batch_size=16,  # the optimizer is advisor's default, AdamW(lr=1e-3)
    )
