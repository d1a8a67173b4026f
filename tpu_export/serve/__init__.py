"""tpu_export.serve: TPU artifacts behind HTTP (Starlette + uvicorn), on PJRT.

    from tpu_export import serve
    serve.run(["out/tpu-v6e/model.tpuexp", "chat=out_lm/tpu-v6e"], port=8000, max_batch=32)
    application = serve.app(["out/tpu-v6e"])        # the ASGI app, for any ASGI server
    ray.serve.run(serve.ray_app(["out/tpu-v6e"], num_replicas=4))   # the same app, N replicas on Ray Serve

The Open Inference Protocol (KServe v2 / Triton) for every artifact, the OpenAI completions and chat endpoints for
an LM written by ``convert_lm``, dynamic batching (continuous batching for an LM converted with ``slots``), a
bounded queue, deadlines and Prometheus metrics (docs/serve.md). Starlette, uvicorn and prometheus_client load
when an app is made (the ``serve`` extra); ``ray_app`` and ``run_ray`` need Ray Serve (the ``ray`` extra).

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

from tpu_export.converter.lazy_exports import lazy_getattr

__all__ = ["app", "run", "ray_app", "run_ray", "ServeConfig", "ServeError"]

_WHERE = {"app": "_server", "run": "_server", "ray_app": "_ray", "run_ray": "_ray", "ServeConfig": "_config",
          "ServeError": "_config"}

__getattr__ = lazy_getattr(__name__, _WHERE)
