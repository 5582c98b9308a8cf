"""What the parent hands a trial child (JSON in): a typed order (`advisor.trial.orders`), what
to build it from, and the files the two sides talk through; the child answers with a
`TrialResult`, written to `Channel.result_path`."""

from __future__ import annotations

import signal

from pydantic import Field

from advisor.frozen import Frozen
from advisor.knobs import TrialConfig
from advisor.results import TrialResult
from advisor.trial.orders import TrialOrder

__all__ = [
    "EARLY_STEPS",
    "PRECISE_AFTER_FRACTION",
    "PROGRESS_INTERVAL_S",
    "Channel",
    "NodePart",
    "TrialRequest",
    "died_without_result",
]

# Of `trial_seconds`: when a search trial's warm-up may have settled and its window may end
# (advisor.trial.child.measure), and so when the parent may start judging it
# (advisor.search.pruning).
PRECISE_AFTER_FRACTION = 0.125
# Optimizer steps whose losses the numerics check compares (advisor.search.checks).
EARLY_STEPS = 3
# A search trial tells the parent how far it got at most this often (at micro-step ends).
PROGRESS_INTERVAL_S = 0.1


class Channel(Frozen):
    """The files parent and child talk through, in the trial's scratch folder."""

    launched_at: float = Field(description="time.time() when the parent started the child")
    result_path: str
    phase_path: str | None = None
    progress_path: str | None = Field(
        default=None, description="where the window's running throughput is appended"
    )
    stop_path: str | None = Field(
        default=None, description="a file the parent creates to end the window early"
    )


class NodePart(Frozen):
    """This machine's part of a trial whose ranks span several (`advisor.trial.nodes`): its
    ranks are `node_rank x per_node` on, and they meet under `key` in node 0's store."""

    node_rank: int = Field(ge=0)
    host: str = Field(description="node 0's rendezvous store: its address")
    port: int
    key: str = Field(description="the trial's own prefix in the store: a fresh rendezvous")


class TrialRequest(Frozen):
    """One trial as the parent hands it to the child: the order, what to build, the channel."""

    order: TrialOrder
    spec: str
    cwd: str
    seed: int = 0
    warmup_steps: int = Field(default=3, ge=1)
    trial_seconds: float = Field(
        default=3.0, gt=0, description="a window order's warm-up and window, each"
    )
    max_measure_steps: int | None = Field(
        default=None,
        ge=1,
        description="at most this many steps: a window's optimizer steps, a noise trial's "
        "recorded gradient norms (a run of known length, whatever the machine's speed)",
    )
    channel: Channel
    node: NodePart | None = Field(
        default=None, description="where the ranks span several machines: this one's part"
    )

    @property
    def config(self) -> TrialConfig:
        """The configuration the order measures."""
        return self.order.config


def died_without_result(config: TrialConfig, who: str, code: int, hint: str = "") -> TrialResult:
    """The result of a process (`who`, e.g. "rank 1") that exited with `code` and no report.

    SIGKILL is what the kernel's OOM killer sends, so it reads as `oom`; anything else crashed.
    """
    if code == -signal.SIGKILL:
        return TrialResult(
            config=config,
            status="oom",
            reason=f"{who} was killed by SIGKILL, which is what the kernel's OOM killer does "
            "when host memory runs out",
        )
    if code < 0:
        known = {member.value: member.name for member in signal.Signals}
        reason = f"{who} died of {known.get(-code, f'signal {-code}')}"
    else:
        reason = f"{who} exited with code {code} without a result{hint}"
    return TrialResult(config=config, status="crashed", reason=reason)
