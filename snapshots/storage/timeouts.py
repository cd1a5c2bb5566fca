"""How long S3 calls may take and how often botocore retries them (``STATEHOUSE_S3_*``): a plain
value, so that choosing them imports no boto3 (only an S3 location does)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class S3Timeouts:
    """botocore's connect and read timeouts and its attempts per call, the first one included
    (standard retry mode). The defaults fail a checkpoint that cannot reach S3 within seconds; the
    next one retries."""

    connect_s: float = 5.0
    read_s: float = 30.0  # also the longest a graceful shutdown waits for an upload on a silent link
    attempts: int = 4  # the first and 3 retries
