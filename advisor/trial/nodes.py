"""A tune over several machines ("nodes", torchrun's word): where they meet, what a multi-node
trial's order carries to each, and the names of the keys they share in node 0's rendezvous
store (a c10d `TCPStore`, as torchrun's c10d rendezvous uses).

Node 0 searches and decides; its store holds, for the whole tune:

- `node/K/hardware`: node K's probed `HardwareProfile` (its joining), `node/K/beat`: a counter
  node K raises every `BEAT_S` (node 0 reads a node whose counter stands still for `SILENCE_S`
  as gone);
- `orders` (how many were posted) and `order/N`: the Nth multi-node trial, a `NodeOrder`;
- under each trial's own prefix (`NodePart.key`): its process group's rendezvous (`KEY/pg/...`),
  and `KEY/node/K`, what node K's ranks measured (`NodeReport`);
- `refused` (node 0 refused the nodes, with the reason) and `done` (the tune ended).

docs/architecture.md ("Several machines") draws the flow; docs/method.md says what it measures.
"""

from __future__ import annotations

from pydantic import Field

from advisor.frozen import Frozen
from advisor.results import TrialResult
from advisor.trial.protocol import TrialRequest

__all__ = [
    "BEAT_S",
    "DONE",
    "FINISHED",
    "ORDERS",
    "REFUSED",
    "SILENCE_S",
    "NodeOrder",
    "NodeReport",
    "Rendezvous",
    "beat_key",
    "hardware_key",
    "order_key",
    "report_key",
]

BEAT_S = 1.0
# A node whose beat stood still this long is gone. A beat is one store round trip from a thread
# of its own: the 2-core test machine, fully loaded by trials, kept it well under a second.
SILENCE_S = 20.0
ORDERS = "orders"
DONE = "done"
FINISHED = "finished"  # `done`'s value when node 0's tune wrote its outputs
REFUSED = "refused"


def order_key(number: int) -> str:
    """The Nth multi-node trial's order."""
    return f"order/{number}"


def beat_key(node: int) -> str:
    """Node `node`'s beat counter."""
    return f"node/{node}/beat"


def hardware_key(node: int) -> str:
    """Node `node`'s probed hardware (its joining)."""
    return f"node/{node}/hardware"


def report_key(trial_key: str, node: int) -> str:
    """What node `node`'s ranks measured in the trial under `trial_key`."""
    return f"{trial_key}/node/{node}"


class Rendezvous(Frozen):
    """Where the nodes of a tune meet: node 0's store at `host:port` (`--rdzv-endpoint`)."""

    nnodes: int = Field(ge=2, description="machines in the tune")
    node_rank: int = Field(ge=0, description="this machine's place: 0 searches, the rest serve")
    host: str
    port: int = Field(ge=1, le=65535)
    join_timeout_s: float = Field(default=300.0, gt=0)

    @classmethod
    def at(cls, endpoint: str, nnodes: int, node_rank: int, join_timeout_s: float) -> Rendezvous:
        """The rendezvous at `endpoint` (HOST:PORT)."""
        host, _, port = endpoint.rpartition(":")
        return cls(
            nnodes=nnodes,
            node_rank=node_rank,
            host=host,
            port=int(port),
            join_timeout_s=join_timeout_s,
        )

    @property
    def endpoint(self) -> str:
        """HOST:PORT, as given."""
        return f"{self.host}:{self.port}"


class NodeOrder(Frozen):
    """A multi-node trial as node 0 posts it: the request its own ranks run (the other nodes
    run the same, with their own channel, folder and node rank)."""

    request: TrialRequest


class NodeReport(Frozen):
    """What one node's part of a trial measured: each of its ranks' results, by global rank,
    or, where the part failed before its ranks reported, one result that says why."""

    node: int
    results: dict[int, TrialResult] = Field(default_factory=dict)
    failure: TrialResult | None = None
