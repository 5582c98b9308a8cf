"""The report's first line: what to change in your configuration, from what to what, and the
one figure of what it buys (the claim's interval where there is one); the other figures stay in
their sections."""

from __future__ import annotations

from advisor.knobs import KNOBS
from advisor.report.verdicts import claim_text
from advisor.results import Recommendation

__all__ = ["change_line", "changed_knobs"]

ASSUMED_OPTIMIZER = "AdamW at lr 1e-3"  # what trials train with where the factory gives none


def changed_knobs(rec: Recommendation) -> list[str]:
    """ "batch_size 32 → 256" for each knob set otherwise than in your configuration, in the
    knob table's order, then the learning rate where it changes."""
    changes = [
        f"{row.name} {getattr(rec.baseline_config, row.name)} → {getattr(rec.config, row.name)}"
        for row in KNOBS
        if getattr(rec.config, row.name) != getattr(rec.baseline_config, row.name)
    ]
    if rec.lr.rule != "yours":
        changes.append(f"learning rate × {rec.lr.scale:.3g} ({rec.lr.label.split('(', 1)[1]}")
    return changes


def change_line(rec: Recommendation) -> str:
    """What to do and what it buys, in one sentence (Markdown-free)."""
    changes = changed_knobs(rec)
    if not changes:
        what = "Keep your configuration: no change measured faster"
    else:
        what = f"Change {', '.join(changes)}; keep everything else"
    if rec.time_to_loss is not None:
        what += f". Your loss {claim_text(rec.time_to_loss)} sooner"
    elif changes and rec.speedup:
        what += f". {rec.speedup:.2f}x your samples/s"
    if not rec.task.custom_optimizer:
        what += f" (your factory gives no optimizer: trained with {ASSUMED_OPTIMIZER}, assumed)"
    return what + "."
