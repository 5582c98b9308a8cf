"""A deeper GPT-2 on longer sequences, tuned under a memory budget.

    pip install -e ".[integrations]"
    advisor tune examples/deep_gpt2.py:factory --memory-budget 1.25GiB

Twelve transformer blocks over 256-token sequences: each sample keeps about 40 MiB of
activations for the backward pass, so your batch of 32 (2.2 GiB at its peak on the project's
CPU) does not fit the budget, and advisor searches the configurations that keep it: the batch
split by accumulation, and activation checkpointing of the `GPT2Block`s, which keeps only each
block's input and recomputes the rest in the backward pass.

Measured on a 2-core CPU (one trial each, 2-s windows): without checkpointing, micro-batches of
4, 8, 16 and 32 peaked at 672, 979, 1,559 and 2,227 MiB and ran at 16.6, 20.2, 18.4 and 18.6
samples/s; with it, at 568, 746, 1,184 and 1,474 MiB and 12.2-14.4 samples/s. Within 1.25 GiB,
checkpointing doubles the micro-batch that fits (8 to 16), but on a CPU a larger micro-batch buys
nothing here (the step is compute-bound from micro-batch 8 on), so it does not pay, and the
report says so ("checkpointing did not pay: micro-batch 8 → 16 within 1.25 GiB, 0.81x
samples/s"). Where small micro-batches leave the device idle (a GPU), the same trade can pay
(docs/method.md, "Memory"). FSDP with two ranks is searched too: on this CPU their peaks add up
above the budget, sharded or not (docs/benchmarks.md, "fsdp_memory").
"""

from hf_gpt2 import MarkovTokens, gpt2

from advisor import TrainingTask

CONTEXT = 256


def factory() -> TrainingTask:
    return TrainingTask(
        model=gpt2(layers=12, context=CONTEXT, use_cache=False),  # no key/value cache to keep
        dataset=MarkovTokens(sequences=2048, context=CONTEXT),
        loss_fn=None,  # GPT2LMHeadModel returns .loss when given labels
        batch_size=32,
    )
