"""The server's settings and its errors: each setting checked once, by its Python name."""

from __future__ import annotations

import dataclasses
import math

__all__ = ["ServeConfig", "ServeError"]


class ServeError(ValueError):
    """A setting or an artifact the server cannot serve; the message names it and the fix."""


def _positive_int(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ServeError(f"{name}: must be an integer >= 1, got {value!r}")


def _non_negative(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ServeError(f"{name}: must be a finite number >= 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """How the server batches, queues and guards its models.

    Attributes:
        max_batch: The most rows one call of a dynamic-batch model runs (requests are gathered up to it); for an
            LM converted with slots, the most requests it decodes at once (1: one at a time).
        batch_timeout_ms: How long the first request of a batch waits for others to join it.
        max_queue: The most requests one model holds waiting to run; one more is answered 503 with Retry-After.
        api_key: When set, every endpoint but the health probes needs ``Authorization: Bearer KEY`` (or
            ``X-API-Key: KEY``); 401 otherwise.
        request_timeout_s: Each request's deadline from its arrival (504 when it passes; a generation stops).
        max_body_bytes: The largest request body; a larger one is answered 413.
    """

    max_batch: int = 32
    batch_timeout_ms: float = 5.0
    max_queue: int = 256
    api_key: str | None = None
    request_timeout_s: float = 60.0
    max_body_bytes: int = 64 << 20

    def __post_init__(self):
        _positive_int(self.max_batch, "max_batch")
        _non_negative(self.batch_timeout_ms, "batch_timeout_ms")
        _positive_int(self.max_queue, "max_queue")
        _positive_int(self.max_body_bytes, "max_body_bytes")
        _non_negative(self.request_timeout_s, "request_timeout_s")
        if self.request_timeout_s == 0:
            raise ServeError("request_timeout_s: must be > 0 (seconds a request may take)")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()
                                         or any(c.isspace() for c in self.api_key)):
            raise ServeError("api_key: must be a non-empty string without whitespace (or None: no key)")
