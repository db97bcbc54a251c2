"""Cleanup function: the Catch of every Task deletes a failed request's intermediates."""

from __future__ import annotations

from typing import Any

from functions import config
from functions.common import s3_client
from ground import layout
from pipeline import transports


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """{"request_id", ...} -> {"request_id", "deleted": number of objects deleted}."""
    request_id = layout.validate_request_id(event.get("request_id"))
    deleted = transports.delete_request(s3_client(), config.current().bucket, request_id)
    return {"request_id": request_id, "deleted": deleted}
