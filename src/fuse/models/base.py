from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    """Base of every wire record: unknown fields are ignored so old clients
    keep working against newer servers, and names populate by field name."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")
