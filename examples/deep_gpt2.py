"""A deeper GPT-2 on longer sequences, trained where memory binds.

    pip install -e ".[integrations]"
    advisor tune examples/deep_gpt2.py:factory --memory-budget 1.5GiB

Twelve transformer blocks over 256-token sequences keep about 40 MiB of activations per sample
for the backward pass, so under the budget only small micro-batches fit, and a small
micro-batch spends much of each step on per-layer overhead. Activation checkpointing keeps only
each block's input and recomputes the rest in the backward pass: it costs compute, and buys a
micro-batch several times larger within the same budget. advisor measures both sides of that
trade (docs/method.md, "Memory").
"""

from hf_gpt2 import VOCAB, MarkovTokens
from transformers import GPT2Config, GPT2LMHeadModel

from advisor import TrainingTask

CONTEXT = 256


def factory() -> TrainingTask:
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=CONTEXT,
        n_embd=128,
        n_layer=12,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,  # training: no key/value cache to keep
    )
    return TrainingTask(
        model=GPT2LMHeadModel(config),
        dataset=MarkovTokens(sequences=2048, context=CONTEXT),
        loss_fn=None,  # GPT2LMHeadModel returns .loss when given labels
        batch_size=32,
    )
