"""Client settings as a small picklable value, so the driver can ship them to executors."""

from __future__ import annotations

from dataclasses import dataclass

from statehouse.protocol.urls import check_url


@dataclass(frozen=True)
class ClientConfig:
    """The replicas' URLs, in any order: the client asks each its index (``GET /v1/topology``)
    before its first job, and learns the others from one URL when the replicas advertise them."""

    urls: tuple[str, ...]
    token: str | None = None
    timeout: float = 30.0
    retries: int = 3
    backoff: float = 0.1
    # How long a write refused 503 rescale_in_progress (its key group is being moved by a live
    # rescale) is retried, obeying Retry-After, before the error is raised.
    rescale_wait: float = 120.0
    max_batch_ops: int = 5000  # operations per row batch (sent while the next one fills)
    max_columnar_rows: int = 10_000  # rows per columnar request: the server's default STATEHOUSE_MAX_BATCH_OPS

    def __post_init__(self) -> None:
        for url in self.urls:
            check_url(url)

    @classmethod
    def of(cls, urls: str | list[str] | tuple[str, ...], **kwargs) -> ClientConfig:
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u.strip()]
        if not urls:
            raise ValueError("give at least one replica URL")
        return cls(urls=tuple(u.strip() for u in urls), **kwargs)
