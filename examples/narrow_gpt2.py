"""A deep, narrow GPT-2 whose recipe fixes its global batch, under a memory budget: where
activation checkpointing pays.

    pip install -e ".[integrations]" cmeel-mimalloc
    LD_PRELOAD=$(python -m advisor.memory) advisor tune examples/narrow_gpt2.py:factory \\
        --memory-budget 420MiB --global-batch-size 64

Forty-eight blocks 32 wide over 32-token sequences: a step runs thousands of small operators, so
a small micro-batch spends most of its time dispatching them, and a larger one is faster per
sample. Each sample keeps about 5 MiB of activations for the backward pass: within the budget
your batch of 64 fits only as micro-batches of 8 (x 8 accumulation). Checkpointing the
`GPT2Block`s keeps only each block's input and recomputes the rest in the backward pass, so a
micro-batch of 64 fits. `--global-batch-size` keeps your 64, as a recipe tuned for it would (its
learning rate, its schedule); without it, the race decides by time to your loss, and on this
model early in training a smaller batch without checkpointing gets there sooner.

The budget is on the resident memory of the trial's processes, and what a CPU process holds
depends on its allocator: glibc's malloc keeps the buffers checkpointing frees in its heaps. So
run it under mimalloc (`LD_PRELOAD`, as above): advisor records the allocator with the machine,
and the generated launch.sh preloads the same. Figures: docs/benchmarks.md, "memory_budget".
"""

from hf_gpt2 import VOCAB, MarkovTokens
from transformers import GPT2Config, GPT2LMHeadModel

from advisor import TrainingTask

CONTEXT = 32


def factory() -> TrainingTask:
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB,
            n_positions=CONTEXT,
            n_embd=32,
            n_layer=48,
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            use_cache=False,  # no key/value cache to keep
        )
    )
    return TrainingTask(
        model=model,
        dataset=MarkovTokens(context=CONTEXT),
        loss_fn=None,  # GPT2LMHeadModel returns .loss when given labels
        batch_size=64,
    )
