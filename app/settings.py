"""Configuration from ``STATEHOUSE_*`` environment variables (names are part of the contract)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STATEHOUSE_", extra="ignore")

    backend: Literal["rocksdb", "heap"] = Field("rocksdb", description="state backend")
    data_dir: str = Field("./data", description="local working directory (RocksDB files)")
    replica_index: int = Field(0, ge=0, description="this replica's index (StatefulSet ordinal)")
    replica_count: int = Field(1, ge=1, description="number of replicas")
    checkpoint_dir: str = Field(
        "./checkpoints", description="checkpoint storage: a path, file://..., s3://bucket/prefix or memory://"
    )
    s3_endpoint_url: str | None = Field(None, description="S3 endpoint for S3-compatible servers")
    num_retained: int = Field(3, ge=1, description="completed checkpoints kept")
    api_tokens: str = Field("", description="comma-separated bearer tokens; empty = auth off")
    snapshot_compression: Literal["zstd", "none"] = Field(
        "zstd", description="per-key-group compression of full snapshots"
    )
    incremental_checkpoints: bool = Field(True, description="RocksDB checkpoints upload only new SST files")

    max_key_bytes: int = Field(4096, ge=1, description="largest key, namespace or map user key, in bytes")
    max_value_bytes: int = Field(1 << 20, ge=1, description="largest encoded value, in bytes")
    max_batch_ops: int = Field(10_000, ge=1, description="most operations in one batch request")
    max_body_bytes: int = Field(64 << 20, ge=1, description="largest request body, in bytes")
    max_page_size: int = Field(1000, ge=1, description="largest page of a listing")

    @model_validator(mode="after")
    def _check_replica(self) -> Settings:
        if self.replica_index >= self.replica_count:
            raise ValueError(
                f"STATEHOUSE_REPLICA_INDEX ({self.replica_index}) must be < STATEHOUSE_REPLICA_COUNT "
                f"({self.replica_count})"
            )
        return self

    @property
    def tokens(self) -> frozenset[str]:
        return frozenset(t.strip() for t in self.api_tokens.split(",") if t.strip())
