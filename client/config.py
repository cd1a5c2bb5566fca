"""Client settings as a small picklable value, so the driver can ship them to executors."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClientConfig:
    """``urls[i]`` must be replica ``i`` (e.g. the StatefulSet's pod ``i``)."""

    urls: tuple[str, ...]
    token: str | None = None
    timeout: float = 30.0
    retries: int = 3
    backoff: float = 0.1
    max_batch_ops: int = 5000  # operations per row batch (sent while the next one fills)
    max_columnar_rows: int = 10_000  # rows per columnar request: the server's default STATEHOUSE_MAX_BATCH_OPS

    @classmethod
    def of(cls, urls: str | list[str] | tuple[str, ...], **kwargs) -> ClientConfig:
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u.strip()]
        if not urls:
            raise ValueError("give at least one replica URL")
        return cls(urls=tuple(u.strip() for u in urls), **kwargs)
