"""The one base of advisor's data models: immutable, and strict about unknown fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Frozen"]


class Frozen(BaseModel):
    """A pydantic model that is immutable (hashable, safe to share) and rejects unknown fields,
    so that a misspelt field in a stored study or a request is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True)
