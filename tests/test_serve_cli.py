"""`tpu-export serve` as a user runs it: a child process serving a slow TPU artifact on loopback; SIGTERM while
requests are in flight lets them finish (answers equal torch eager) before the process exits. The command line's
mistakes are one line naming the flag."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from tests.test_serve import _slow_body, convert_slow, metric, outputs, rel_err, wait_for  # noqa: E402
from tpu_export.cli import main  # noqa: E402

CLI = "import sys; from tpu_export.cli import main; sys.exit(main())"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigterm_drains_the_requests_in_flight(tmp_path):
    model, path = convert_slow(tmp_path)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w+")
    proc = subprocess.Popen([sys.executable, "-c", CLI, "serve", f"slow={path}", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=os.path.dirname(os.path.dirname(__file__)))
    try:
        def ready():
            assert proc.poll() is None, open(tmp_path / "server.log").read()
            try:
                return httpx.get(f"{base}/v2/health/ready").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, timeout=300, what="the server to start")
        bodies = [_slow_body(10), _slow_body(11)]
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(httpx.post, f"{base}/v2/models/slow/infer", json=bodies[0][0], timeout=120)
            wait_for(lambda: metric(base, "tpu_export_serve_running", model="slow") == 1, what="the first call")
            queued = pool.submit(httpx.post, f"{base}/v2/models/slow/infer", json=bodies[1][0], timeout=120)
            wait_for(lambda: metric(base, "tpu_export_serve_queue_depth", model="slow") == 1, what="one queued")
            proc.send_signal(signal.SIGTERM)
            answers = [running.result(), queued.result()]
        # uvicorn drains, then ends the process by the signal it was sent (the shell's 143), as a service manager
        # expects
        assert proc.wait(120) == -signal.SIGTERM
        for (_, x), r in zip(bodies, answers):
            (got,) = outputs(r).values()
            with torch.no_grad():
                want = model(torch.from_numpy(x)).numpy()
            assert rel_err(got, want) <= 1e-4
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{base}/v2/health/live")
        log.seek(0)
        text = log.read()
        assert f"tpu-export serve: slow on {base}" in text and "Finished server process" in text, text
        assert text.index("Shutting down") < text.index("POST /v2/models/slow/infer HTTP/1.1\" 200"), text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.parametrize("argv, words", [
    (["--max-batch", "0"], "--max-batch takes an integer >= 1, got 0"),
    (["--max-queue", "-1"], "--max-queue takes an integer >= 1"),
    (["--port", "70000"], "--port takes 0..65535"),
    (["--request-timeout", "0"], "--request-timeout takes seconds > 0"),
    (["--api-key", " "], "--api-key (or $TPU_EXPORT_API_KEY) must be a non-empty word"),
])
def test_flags_are_checked_first(argv, words, capsys, tmp_path):
    assert main(["serve", str(tmp_path / "nothing.tpuexp"), *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_an_artifact_that_cannot_be_served_is_one_line(capsys, tmp_path):
    assert main(["serve", str(tmp_path / "nothing.tpuexp"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "nothing.tpuexp: no such file or folder" in err and len(err.strip().splitlines()) == 1, err
    (tmp_path / "m.litertlm").write_bytes(b"x")
    assert main(["serve", str(tmp_path / "m.litertlm"), "--port", "0"]) == 2
    assert "runs TPU artifacts (.tpuexp)" in capsys.readouterr().err


def test_a_taken_port_fails_before_the_models_load(capsys, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["serve", str(tmp_path / "nothing.tpuexp"), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--port {port} on 127.0.0.1: Address already in use; pick another port" in err, err


def test_help_shows_examples(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "tpu-export serve out/tpu-v6e" in out and "--batch-timeout-ms" in out
