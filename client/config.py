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
    max_batch_ops: int = 5000

    @classmethod
    def of(cls, urls: str | list[str] | tuple[str, ...], **kwargs) -> ClientConfig:
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u.strip()]
        if not urls:
            raise ValueError("give at least one replica URL")
        return cls(urls=tuple(u.strip() for u in urls), **kwargs)
