"""The server's Prometheus metrics, in a registry of its own (two apps in one process never share counters)."""

from __future__ import annotations

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """Counters, gauges and histograms of requests, batches, queues and generated tokens."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry(auto_describe=True)
        p = "tpu_export_serve_"
        self.requests = Counter(p + "requests", "HTTP requests answered, by model, endpoint and status code",
                                ["model", "endpoint", "code"], registry=r)
        self.latency = Histogram(p + "request_latency_seconds", "Time from a request's arrival to its answer",
                                 ["model", "endpoint"], buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_rows = Histogram(p + "batch_size", "Rows per model call (before padding)", ["model"],
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.batch_requests = Histogram(p + "batch_requests", "Requests per model call", ["model"],
                                        buckets=_BATCH_BUCKETS, registry=r)
        self.queue_depth = Gauge(p + "queue_depth", "Requests waiting to run", ["model"], registry=r)
        self.running = Gauge(p + "running", "Requests in the model call now running", ["model"], registry=r)
        self.rejected = Counter(p + "rejected", "Requests refused before queueing (queue full)",
                                ["model", "reason"], registry=r)
        self.cancelled = Counter(p + "cancelled", "Requests dropped or stopped: client gone or deadline passed",
                                 ["model", "reason"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of completed generations", ["model"],
                                     registry=r)
        self.generated_tokens = Counter(p + "generated_tokens", "Tokens generated", ["model"], registry=r)
        self.tokens_per_s = Gauge(p + "decode_tokens_per_second", "Decode speed of the last generation",
                                  ["model"], registry=r)

    def text(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
