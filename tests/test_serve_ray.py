"""``tpu_export.serve.ray_app`` on a local Ray cluster (loopback, no dashboard): two replicas of a small artifact
behind Ray Serve's HTTP proxy, real httpx clients. Each answer names the replica that served it (the
``x-tpu-export-replica`` header, Ray's replica id) and is checked against torch eager. One replica is killed
(``ray.kill``) under load: every request either gets its right answer or a 503 that its client retries, and Ray
starts a replacement that then serves."""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray Serve is the optional 'ray' extra")
pytest.importorskip("ray.serve", reason="Ray Serve is the optional 'ray' extra")
httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

import tpu_export  # noqa: E402
from tpu_export import serve as tserve  # noqa: E402

TOL = 1e-5  # float32 PJRT CPU vs torch eager, relative to the output's largest magnitude
APP = "tpu-export"


class Chain(torch.nn.Module):
    """A few hundred milliseconds a call here: longer than a kill takes to land, so the killed replica has
    requests in flight that it cannot finish."""

    def __init__(self, n: int = 2048, steps: int = 100):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, n)
        self.w = torch.nn.Parameter(torch.randn(n, n) / n ** 0.5)
        self.out = torch.nn.Linear(n, 4)
        self.steps = steps

    def forward(self, x):
        h = self.fc(x)
        for _ in range(self.steps):
            h = torch.tanh(h @ self.w)
        return self.out(h)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(module, base URL): the artifact served by 2 replicas; the cluster is shut down whatever happens."""
    from ray import serve

    from tpu_export.serve import _ray as ray_mod

    root = tmp_path_factory.mktemp("serve_ray")
    model = Chain().eval()
    tpu_export.convert(model, (torch.zeros(2, 8),), targets={"tpu-v6e": {"aot": False}}, out_dir=root / "chain",
                       dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=16)},))
    before = os.environ.get(ray_mod.PROXY_CALLBACK_ENV)
    os.environ[ray_mod.PROXY_CALLBACK_ENV] = ray_mod.PROXY_CALLBACK  # the local cluster's proxy inherits it
    port = _port()
    try:
        ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(tserve.ray_app([f"chain={root}/chain/tpu-v6e"], num_replicas=2, max_batch=2,
                                 ray_actor_options={"num_cpus": 1}), name=APP, route_prefix="/")
        yield model, f"http://127.0.0.1:{port}"
    finally:
        try:
            if ray.is_initialized():
                serve.shutdown()
        finally:
            ray.shutdown()
            if before is None:
                os.environ.pop(ray_mod.PROXY_CALLBACK_ENV, None)
            else:
                os.environ[ray_mod.PROXY_CALLBACK_ENV] = before


def _body(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


def _check(model, x: np.ndarray, answer: dict) -> None:
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    got = np.asarray(answer["outputs"][0]["data"], np.float32).reshape(want.shape)
    assert np.abs(got - want).max() <= TOL * max(1.0, float(np.abs(want).max())), (got, want)


def _replicas() -> set:
    return {a["name"].rsplit("#", 1)[1] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(f"SERVE_REPLICA::{APP}#")}


@pytest.mark.slow
@pytest.mark.subprocess  # the Ray cluster's processes
def test_load_spreads_over_both_replicas(cluster):
    model, base = cluster
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(48)]

    def one(x):
        with httpx.Client(base_url=base, timeout=120) as c:
            r = c.post("/v2/models/chain/infer", json=_body(x))
            assert r.status_code == 200, r.text
            return r.headers["x-tpu-export-replica"], r.json()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, xs))
    for x, (_, answer) in zip(xs, results):
        _check(model, x, answer)
    served = {}
    for replica, _ in results:
        served[replica] = served.get(replica, 0) + 1
    assert set(served) == _replicas() and len(served) == 2, (served, _replicas())
    assert min(served.values()) >= 4, served  # both took a real share, not one stray request


@pytest.mark.slow
@pytest.mark.subprocess  # the Ray cluster's processes
def test_killed_replica_is_replaced_and_no_request_is_lost(cluster):
    model, base = cluster
    original = _replicas()
    assert len(original) == 2
    lock, stop = threading.Lock(), threading.Event()
    finals: dict = {}  # request index -> the replica of its one final (right) answer
    statuses: list = []
    retried, nxt = [0], [0]

    def client():
        with httpx.Client(base_url=base, timeout=120) as c:
            while not stop.is_set():
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                x = np.random.default_rng(1000 + i).standard_normal((1, 8)).astype(np.float32)
                for _attempt in range(30):
                    r = c.post("/v2/models/chain/infer", json=_body(x))
                    with lock:
                        statuses.append(r.status_code)
                    if r.status_code == 200:
                        break
                    assert r.status_code == 503, (r.status_code, r.text)  # the only failure a client sees: retry
                    assert r.headers.get("retry-after") == "1", r.headers
                    with lock:
                        retried[0] += 1
                    time.sleep(0.2)
                else:
                    raise AssertionError(f"request {i} was never answered")
                _check(model, x, r.json())
                with lock:
                    assert i not in finals
                    finals[i] = r.headers["x-tpu-export-replica"]

    errors = []

    def guarded(t):
        try:
            t()
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=guarded, args=(client,)) for _ in range(8)]
    new, killed_at, victim = set(), 0, sorted(original)[0]
    for t in threads:
        t.start()
    try:
        end = time.monotonic() + 20
        while time.monotonic() < end and not errors:  # both replicas busy with the load
            with lock:
                if all(sum(r == o for r in finals.values()) >= 3 for o in original):
                    break
            time.sleep(0.05)
        ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP}#{APP}#{victim}", namespace="serve"), no_restart=True)
        killed_at = len(finals)
        end = time.monotonic() + 75  # Ray notices the death, starts a replica, which compiles, then serves
        while time.monotonic() < end and not errors:
            with lock:
                new = set(list(finals.values())[killed_at:]) - original
            if new:
                break
            time.sleep(0.1)
        time.sleep(0.5)  # the replacement takes a share of the load
    finally:
        stop.set()
        for t in threads:
            t.join(150)
    if errors:
        raise errors[0]
    assert new, f"no replacement replica served within the time; replicas now {_replicas()}"
    assert victim not in _replicas()
    assert len(finals) == nxt[0], "a request ended without its answer"
    assert set(statuses) <= {200, 503}, sorted(set(statuses))
    assert retried[0] >= 1, (
        f"no request was in flight on the killed replica: the kill tested nothing ({len(finals)} requests, "
        f"{killed_at} before the kill, {sum(r == victim for r in finals.values())} on the victim)")


@pytest.mark.parametrize("argv, words", [
    (["--replicas", "2"], "--replicas is a Ray Serve setting: add --ray"),
    (["--ray-address", "auto"], "--ray-address is a Ray Serve setting: add --ray"),
    (["--ray", "--port", "0"], "--port 0 (any free port) is not taken with --ray"),
    (["--ray", "--replicas", "0"], "--replicas takes an integer >= 1, got 0"),
    (["--ray", "--replica-resources", "TPU"], "--replica-resources: 'TPU' is not NAME=AMOUNT"),
    (["--ray"], "nothing.tpuexp: no such file or folder"),  # checked before any Ray cluster starts
])
def test_ray_flags_are_checked_first(argv, words, capsys, tmp_path):
    from tpu_export.cli import main

    assert main(["serve", str(tmp_path / "nothing.tpuexp"), *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_ray_app_refuses_what_it_does_not_take(tmp_path):
    with pytest.raises(tserve.ServeError, match="^num_replicas: must be an integer >= 1, got 0"):
        tserve.ray_app([str(tmp_path)], num_replicas=0)
    with pytest.raises(tserve.ServeError, match="^port: not a setting of tpu_export.serve.app"):
        tserve.ray_app([str(tmp_path)], port=8000)
    with pytest.raises(tserve.ServeError, match="^max_batch: must be an integer >= 1"):
        tserve.ray_app([str(tmp_path)], max_batch=0)
    with pytest.raises(tserve.ServeError, match="missing: no such file or folder"):
        tserve.ray_app([str(tmp_path / "missing")])


def test_replica_resources_map_to_ray_actor_options():
    from tpu_export.cli_serve import _replica_resources

    assert _replica_resources("TPU=4") == {"resources": {"TPU": 4.0}}
    assert _replica_resources("CPU=2, GPU=1,accel=0.5") == {"num_cpus": 2.0, "num_gpus": 1.0,
                                                            "resources": {"accel": 0.5}}
