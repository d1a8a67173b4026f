"""`tpu_export.serve` on loopback with real clients (httpx): TPU artifacts converted here from seeded torch modules
(no AOT compile: PJRT CPU compiles them), served by uvicorn in a thread. Numbers are checked against torch eager;
batched answers are checked bit-for-bit against the same requests sent alone. A slow model (a chain of 768x768
matmuls, ~1 s a call) holds the worker so that the queue, deadline and disconnect cases are deterministic."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

import tpu_export  # noqa: E402
from tpu_export import serve  # noqa: E402

pytestmark = [pytest.mark.slow]

TOL = 1e-5  # float32 PJRT CPU vs torch eager, relative to the output's largest magnitude


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(12, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x, scale):
        h = torch.nn.functional.gelu(self.fc1(x))
        return {"logits": self.fc2(h) * scale, "hidden": h}


class Slow(torch.nn.Module):
    """About a second a call on a loaded 2-core host: a chain of dependent matmuls."""

    def __init__(self, n: int = 768, steps: int = 60):
        super().__init__()
        torch.manual_seed(1)
        self.w = torch.nn.Parameter(torch.randn(n, n) / n ** 0.5)
        self.steps = steps

    def forward(self, x):
        h = self.w * x.reshape(-1, 1)
        for _ in range(self.steps):
            h = torch.tanh(h @ self.w)
        return h.mean(0, keepdim=True)


def convert_slow(root) -> tuple:
    """(the Slow module, its tpu-v6e folder under ``root``)."""
    slow = Slow().eval()
    tpu_export.convert(slow, (torch.zeros(1, 768),), targets={"tpu-v6e": {"aot": False}}, out_dir=root / "slow")
    return slow, str(root / "slow" / "tpu-v6e")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    batch = torch.export.Dim("batch", min=1, max=64)
    mlp = Mlp().eval()
    g = torch.Generator().manual_seed(0)
    tpu_export.convert(mlp, (torch.randn(2, 12, generator=g), torch.randn(2, 1, generator=g)),
                       targets={"tpu-v6e": {"aot": False}}, out_dir=root / "mlp",
                       dynamic_shapes=({0: batch}, {0: batch}))
    return {"mlp": (mlp, str(root / "mlp" / "tpu-v6e")), "slow": convert_slow(root)}


@contextlib.contextmanager
def serving(application, start_timeout: float = 300.0):
    """``application`` under uvicorn on a free loopback port, in a thread; yields its base URL. Leaving waits for
    the requests in flight (uvicorn's graceful shutdown)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(application, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    end = time.monotonic() + start_timeout
    while not server.started:
        assert thread.is_alive(), "the server stopped while starting"
        assert time.monotonic() < end, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


def metric(base: str, name: str, headers=None, **labels) -> float:
    """One sample of /metrics (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", headers=headers or {}).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def wait_for(cond, timeout: float = 60.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def tensor(name: str, a: np.ndarray, datatype: str = "FP32") -> dict:
    return {"name": name, "shape": list(a.shape), "datatype": datatype, "data": a.ravel().tolist()}


def mlp_request(rows: int, seed: int) -> tuple[dict, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 12)).astype(np.float32)
    s = (rng.random((rows, 1)) + 0.5).astype(np.float32)
    return {"inputs": [tensor("x", x), tensor("scale", s)]}, x, s


def outputs(resp) -> dict:
    assert resp.status_code == 200, resp.text
    return {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in resp.json()["outputs"]}


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))


@pytest.fixture(scope="module")
def mlp_server(artifacts):
    with serving(serve.app([f"mlp={artifacts['mlp'][1]}"], max_batch=16, batch_timeout_ms=20)) as base:
        yield base


def test_health_and_metadata(mlp_server):
    c = httpx.Client(base_url=mlp_server)
    assert c.get("/v2/health/live").json() == {"live": True}
    assert c.get("/v2/health/ready").json() == {"ready": True}
    assert c.get("/v2/models/mlp/ready").json() == {"name": "mlp", "ready": True}
    meta = c.get("/v2/models/mlp").json()
    assert meta["name"] == "mlp" and meta["platform"] == "tpu-export_cpu"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 12]},
                              {"name": "scale", "datatype": "FP32", "shape": [-1, 1]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 4]},
                               {"name": "hidden", "datatype": "FP32", "shape": [-1, 32]}]
    r = c.get("/v2/models/nope")
    assert r.status_code == 404 and "served: ['mlp']" in r.json()["error"]
    for path in ("/v2/models/..%2F..%2Fetc%2Fpasswd", "/v2/models/%2Fetc%2Fpasswd/infer"):  # names, never paths
        assert c.request("GET" if path.count("/") == 3 else "POST", path).status_code in (404, 405)
    assert c.get("/v2").json()["name"] == "tpu-export"


def test_infer_matches_torch_eager(mlp_server, artifacts):
    model = artifacts["mlp"][0]
    body, x, s = mlp_request(3, seed=5)
    body["id"] = "req-1"
    r = httpx.post(f"{mlp_server}/v2/models/mlp/infer", json=body)
    got = outputs(r)
    assert r.json()["id"] == "req-1" and r.json()["model_name"] == "mlp"
    with torch.no_grad():
        want = model(torch.from_numpy(x), torch.from_numpy(s))
    for k in ("logits", "hidden"):
        assert got[k].shape == tuple(want[k].shape)
        assert rel_err(got[k], want[k].numpy()) <= TOL
    # only the outputs asked for
    r = httpx.post(f"{mlp_server}/v2/models/mlp/infer", json={**body, "outputs": [{"name": "hidden"}]})
    assert [o["name"] for o in r.json()["outputs"]] == ["hidden"]
    assert np.array_equal(outputs(r)["hidden"], got["hidden"])


def test_32_concurrent_clients_get_their_solo_results(mlp_server, artifacts):
    model = artifacts["mlp"][0]
    reqs = [mlp_request(1 + i % 3, seed=100 + i) for i in range(32)]
    with httpx.Client(base_url=mlp_server, timeout=120) as c:
        solo = [outputs(c.post("/v2/models/mlp/infer", json=b)) for b, _, _ in reqs]  # one at a time
    before = (metric(mlp_server, "tpu_export_serve_batch_requests_count", model="mlp"),
              metric(mlp_server, "tpu_export_serve_batch_requests_sum", model="mlp"))
    assert before[0] == before[1]  # alone, each request was a call of its own
    gate = threading.Barrier(32)

    def client(i):
        with httpx.Client(base_url=mlp_server, timeout=120) as c:
            gate.wait()
            return outputs(c.post("/v2/models/mlp/infer", json=reqs[i][0]))

    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(client, range(32)))
    calls = metric(mlp_server, "tpu_export_serve_batch_requests_count", model="mlp") - before[0]
    served = metric(mlp_server, "tpu_export_serve_batch_requests_sum", model="mlp") - before[1]
    assert served == 32 and calls < 32, f"32 requests ran in {calls} calls: nothing was batched"
    for i, ((_, x, s), alone, batched) in enumerate(zip(reqs, solo, together)):
        for k in ("logits", "hidden"):
            assert np.array_equal(batched[k], alone[k]), f"request {i}: {k} differs batched vs alone"
        with torch.no_grad():
            want = model(torch.from_numpy(x), torch.from_numpy(s))
        assert rel_err(batched["logits"], want["logits"].numpy()) <= TOL


def test_bad_requests_are_400_naming_the_field(mlp_server):
    body, x, s = mlp_request(2, seed=1)
    url = f"{mlp_server}/v2/models/mlp/infer"

    def bad(payload, field, *words, raw=None):
        r = httpx.post(url, content=raw) if raw is not None else httpx.post(url, json=payload)
        assert r.status_code == 400, r.text
        msg = r.json()["error"]
        assert msg.startswith(field), msg
        for w in words:
            assert w in msg, msg

    bad(None, "body", "not valid JSON", raw=b'{"inputs": [')
    bad(None, "body", "JSON object", raw=b"[1, 2]")
    bad({**body, "extra": 1}, "extra", "not a field")
    wrong_name = {"inputs": [tensor("y", x), tensor("scale", s)]}
    bad(wrong_name, "inputs[0].name", "'y' is not an input", "['x', 'scale']")
    bad({"inputs": [tensor("x", x)]}, "inputs", "also takes ['scale']")
    bad({"inputs": [tensor("x", x[:, :11]), tensor("scale", s)]}, "inputs[0].shape", "dim 1 must be 12")
    bad({"inputs": [tensor("x", x), tensor("scale", s[:1])]}, "inputs", "scale")
    bad({"inputs": [tensor("x", x, "INT32"), tensor("scale", s)]}, "inputs[0].datatype", "takes FP32")
    short = tensor("x", x)
    short["data"] = short["data"][:-1]
    bad({"inputs": [short, tensor("scale", s)]}, "inputs[0].data", "holds 23 values")
    text = tensor("x", x)
    text["data"] = ["a"] * 24
    bad({"inputs": [text, tensor("scale", s)]}, "inputs[0].data", "must be numbers")
    big = np.zeros((65, 12), np.float32)
    bad({"inputs": [tensor("x", big), tensor("scale", np.ones((65, 1), np.float32))]}, "inputs[0].shape",
        "[1, 64]")
    bad({**body, "outputs": [{"name": "nope"}]}, "outputs[0].name", "not an output")
    bad({**body, "parameters": {"binary_data_output": True}}, "parameters", "no request parameters")


def test_body_limit_and_api_key(artifacts):
    app = serve.app([f"mlp={artifacts['mlp'][1]}"], max_batch=4, api_key="s3cret", max_body_bytes=4096)
    body, _, _ = mlp_request(2, seed=2)
    with serving(app) as base:
        url = f"{base}/v2/models/mlp/infer"
        assert httpx.get(f"{base}/v2/health/ready").status_code == 200  # probes need no key
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "s3cre"}):
            r = httpx.post(url, json=body, headers=headers)
            assert r.status_code == 401 and "API key" in r.json()["error"], r.text
            assert r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{base}/metrics").status_code == 401
        assert httpx.get(f"{base}/v1/models").json()["error"]["type"] == "authentication_error"
        ok = {"Authorization": "Bearer s3cret"}
        assert httpx.post(url, json=body, headers=ok).status_code == 200
        assert httpx.post(url, json=body, headers={"X-API-Key": "s3cret"}).status_code == 200
        huge, _, _ = mlp_request(64, seed=3)
        r = httpx.post(url, json=huge, headers=ok)
        assert r.status_code == 413 and "at most 4096" in r.json()["error"], r.text

        def chunks():  # no Content-Length: the limit counts the bytes as they come
            data = json.dumps(huge).encode()
            for i in range(0, len(data), 1000):
                yield data[i:i + 1000]

        r = httpx.post(url, content=chunks(), headers=ok)
        assert r.status_code == 413, r.text


def _slow_body(seed: int) -> tuple[dict, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((1, 768)).astype(np.float32)
    return {"inputs": [tensor("x", x)]}, x


def test_queue_full_is_503_with_retry_after(artifacts):
    app = serve.app([f"slow={artifacts['slow'][1]}"], max_queue=1)
    with serving(app) as base, ThreadPoolExecutor(2) as pool:
        url = f"{base}/v2/models/slow/infer"
        first = pool.submit(httpx.post, url, json=_slow_body(1)[0], timeout=120)
        wait_for(lambda: metric(base, "tpu_export_serve_running", model="slow") == 1, what="the first call")
        second = pool.submit(httpx.post, url, json=_slow_body(2)[0], timeout=120)
        wait_for(lambda: metric(base, "tpu_export_serve_queue_depth", model="slow") == 1, what="one queued")
        r = httpx.post(url, json=_slow_body(3)[0])
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert "--max-queue" in r.json()["error"]
        assert first.result().status_code == 200 and second.result().status_code == 200
        assert metric(base, "tpu_export_serve_rejected_total", model="slow", reason="queue_full") == 1


def _call_s(path: str) -> float:
    """One warm call of the artifact on this host now, in seconds (the host's speed and load vary the call ~5x)."""
    from tpu_export.tpu_backend import runtime

    program, x = runtime.load(os.path.join(path, "model.tpuexp")), _slow_body(0)[1]
    np.asarray(program(x))
    t0 = time.perf_counter()
    np.asarray(program(x))
    return time.perf_counter() - t0


def test_deadline_and_disconnect_drop_queued_requests(artifacts):
    model = artifacts["slow"][0]
    # a deadline (and a client's patience) well inside one call, so that a request queued behind a running call
    # is past it however fast this host runs the call
    short = min(0.3, _call_s(artifacts["slow"][1]) / 3)
    app = serve.app([f"slow={artifacts['slow'][1]}"], request_timeout_s=short)
    with serving(app) as base, ThreadPoolExecutor(2) as pool:
        url = f"{base}/v2/models/slow/infer"
        body, x = _slow_body(4)
        first = pool.submit(httpx.post, url, json=body, timeout=120)
        wait_for(lambda: metric(base, "tpu_export_serve_running", model="slow") == 1, what="the first call")
        r = httpx.post(url, json=_slow_body(5)[0], timeout=120)  # queued behind a running call: past its deadline
        assert r.status_code == 504 and "--request-timeout" in r.json()["error"], r.text
        first = first.result()
        assert first.status_code in (200, 504)  # a call that outlives the deadline is answered 504 too
        assert metric(base, "tpu_export_serve_cancelled_total", model="slow", reason="deadline") >= 1
    app = serve.app([f"slow={artifacts['slow'][1]}"], request_timeout_s=120)
    with serving(app) as base, ThreadPoolExecutor(2) as pool:
        url = f"{base}/v2/models/slow/infer"
        body, x = _slow_body(6)
        first = pool.submit(httpx.post, url, json=body, timeout=120)
        wait_for(lambda: metric(base, "tpu_export_serve_running", model="slow") == 1, what="the first call")
        with pytest.raises(httpx.ReadTimeout):  # the client gives up on a queued request and hangs up
            httpx.post(url, json=_slow_body(7)[0], timeout=httpx.Timeout(120, read=short))
        wait_for(lambda: metric(base, "tpu_export_serve_cancelled_total", model="slow", reason="disconnect") == 1,
                 what="the disconnect")
        (got,) = outputs(first.result()).values()
        with torch.no_grad():
            want = model(torch.from_numpy(x)).numpy()
        assert rel_err(got, want) <= 1e-4  # 60 chained float32 matmuls
        wait_for(lambda: metric(base, "tpu_export_serve_queue_depth", model="slow") == 0, what="the queue")
        # the dropped request never ran: only the first (and the warm-up, outside the batcher) did
        assert metric(base, "tpu_export_serve_batch_requests_sum", model="slow") == 1


class Tagger(torch.nn.Module):
    """Token ids in (int64 in torch, INT32 in the artifact), one score per token out."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.emb = torch.nn.Embedding(50, 8)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, ids):
        return self.out(torch.tanh(self.emb(ids)))


def test_integer_ids_and_their_table_bound(tmp_path):
    model = Tagger().eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    with pytest.warns(UserWarning, match="become 32-bit"):  # the ids run as int32, as TPUs take them
        tpu_export.convert(model, (torch.zeros(2, 5, dtype=torch.long),), targets={"tpu-v6e": {"aot": False}},
                           out_dir=tmp_path / "tagger", dynamic_shapes=({0: batch},))
    with serving(serve.app([str(tmp_path / "tagger" / "tpu-v6e")], max_batch=8)) as base:
        meta = httpx.get(f"{base}/v2/models/tagger").json()
        assert meta["inputs"] == [{"name": "ids", "datatype": "INT32", "shape": [-1, 5]}]
        ids = np.random.default_rng(0).integers(0, 50, (3, 5)).astype(np.int32)
        r = httpx.post(f"{base}/v2/models/tagger/infer", json={"inputs": [tensor("ids", ids, "INT32")]})
        (got,) = outputs(r).values()
        with torch.no_grad():
            want = model(torch.from_numpy(ids).long()).numpy()
        assert rel_err(got, want) <= TOL
        ids[1, 2] = 50  # past the 50-row table: torch raises, the compiled gather would clamp
        r = httpx.post(f"{base}/v2/models/tagger/infer", json={"inputs": [tensor("ids", ids, "INT32")]})
        assert r.status_code == 400 and r.json()["error"].startswith("inputs[0].data: "), r.text
        assert "index out of range" in r.json()["error"]
        floats = tensor("ids", ids.astype(np.float32), "INT32")
        r = httpx.post(f"{base}/v2/models/tagger/infer", json={"inputs": [floats]})
        assert r.status_code == 400 and "must be integers" in r.json()["error"], r.text


def test_app_refuses_what_it_cannot_serve(artifacts, tmp_path):
    path = artifacts["mlp"][1]
    with pytest.raises(serve.ServeError, match=r"no such file or folder"):
        serve.app([str(tmp_path / "missing.tpuexp")])
    with pytest.raises(serve.ServeError, match=r"the name 'mlp' is taken .* NAME=PATH"):
        serve.app([f"mlp={path}", f"mlp={artifacts['slow'][1]}"])
    (tmp_path / "m.tflite").write_bytes(b"x")
    with pytest.raises(serve.ServeError, match=r"m.tflite: the server runs TPU artifacts"):
        serve.app([str(tmp_path / "m.tflite")])
    with pytest.raises(serve.ServeError, match=r"^max_batch: must be an integer >= 1, got 0"):
        serve.app([path], max_batch=0)
    with pytest.raises(serve.ServeError, match=r"^api_key: "):
        serve.app([path], api_key="two words")
    with pytest.raises(serve.ServeError, match=r"^artifacts: give at least one"):
        serve.app([])
    assert re.fullmatch(r"mlp", next(iter(serve.app([path]).state.server.models)))  # named after out/


def test_docstring_example():
    import doctest

    from tpu_export.serve import _server

    res = doctest.testmod(_server, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert res.attempted and not res.failed
