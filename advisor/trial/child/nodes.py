"""A trial's side of node 0's rendezvous store (`advisor.trial.nodes`): connect, post the trial
to the other nodes, report a node's part, gather the parts, and tell a silent node from a slow
one by its beat."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import timedelta

import torch.distributed as dist

from advisor.results import TrialResult
from advisor.trial.nodes import (
    DONE,
    ORDERS,
    SILENCE_S,
    NodeOrder,
    NodeReport,
    beat_key,
    order_key,
    report_key,
)
from advisor.trial.protocol import NodePart

__all__ = ["BeatWatch", "connect", "gather_reports", "post_order", "post_report"]

CONNECT_TIMEOUT = timedelta(seconds=60)
POLL_S = 0.1


def connect(host: str, port: int, timeout: timedelta = CONNECT_TIMEOUT) -> dist.TCPStore:
    """A client of node 0's store (it retries until the store answers or `timeout` passes)."""
    return dist.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)


def post_order(store: dist.Store, order: NodeOrder) -> int:
    """Post a multi-node trial for the other nodes; its number."""
    number = int(store.add(ORDERS, 1))
    store.set(order_key(number), order.model_dump_json())
    return number


def post_report(store: dist.Store, part: NodePart, report: NodeReport) -> None:
    """Tell node 0 what this machine's part of the trial measured."""
    store.set(report_key(part.key, part.node_rank), report.model_dump_json())


class BeatWatch:
    """When each watched node's beat last moved, on this process's clock: a node whose beat
    stood still for `silence_s` is gone (a stalled or vanished machine answers nothing else).
    Node 0's store gone, or the tune marked done, ends the watch too."""

    def __init__(
        self, store: dist.Store, nodes: Iterable[int], silence_s: float = SILENCE_S
    ) -> None:
        self._store, self.silence_s = store, silence_s
        self.gone_node: int | None = None  # the machine `silent` found silent
        now = time.monotonic()
        self._seen = {node: (self._beat(node), now) for node in nodes}

    def _beat(self, node: int) -> int:
        return int(self._store.add(beat_key(node), 0))  # adding 0 reads it

    def silent(self) -> str | None:
        """Why the trial cannot go on ("node 1 stopped answering after 20 s"), or None;
        `gone_node` says which machine, where one went silent (else node 0 is the cause)."""
        self.gone_node = None
        try:
            return self._silent()
        except (RuntimeError, OSError):
            return "node 0's rendezvous store stopped answering"

    def _silent(self) -> str | None:
        if self._store.check([DONE]):
            return "node 0 ended the tune"
        now = time.monotonic()
        for node, (beat, since) in list(self._seen.items()):
            current = self._beat(node)
            if current != beat:
                self._seen[node] = (current, now)
            elif now - since > self.silence_s:
                self.gone_node = node
                del self._seen[node]  # said once; the others are still watched
                return f"node {node} stopped answering after {now - since:.0f} s"
        return None


def gather_reports(
    store: dist.Store, part: NodePart, nodes: Iterable[int], watch: BeatWatch
) -> dict[int, NodeReport] | str:
    """Every other node's report of its part, waiting while their beats go on; else why not."""
    wanted = {node: report_key(part.key, node) for node in nodes}
    reports: dict[int, NodeReport] = {}
    while len(reports) < len(wanted):
        for node, key in wanted.items():
            if node not in reports and store.check([key]):
                reports[node] = NodeReport.model_validate_json(store.get(key))
        if len(reports) < len(wanted):
            if (gone := watch.silent()) is not None:
                return gone
            time.sleep(POLL_S)
    return reports


def failed_part(part: NodePart, result: TrialResult) -> NodeReport:
    """A node's report where its part failed before its ranks could report."""
    return NodeReport(node=part.node_rank, failure=result)
