"""Runs a .tflite in headless Chromium with LiteRT.js: a local HTTP server plus web/run_model.mjs.

The server binds 127.0.0.1 on a free port and serves web/ (the page, the npm packages and their
wasm files) and, under /models/, one folder holding the model. Nothing is fetched from outside.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import tempfile
import threading

import numpy as np

WEB = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "web")
CHROMIUM = "/usr/bin/chromium"


def missing_reason() -> str | None:
    """Why the browser test cannot run here, or None. CI installs both (see the report/README)."""
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is missing (apt-get install -y chromium)"
    if not os.path.isdir(os.path.join(WEB, "node_modules", "@litertjs", "core")):
        return "web/node_modules is missing (cd web && npm ci)"
    if shutil.which("node") is None:
        return "node is missing"
    return None


class _Handler(http.server.SimpleHTTPRequestHandler):
    """web/ at /, the model folder at /models/; wasm gets its MIME type for streaming compile."""

    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".wasm": "application/wasm",
                      ".js": "text/javascript", ".mjs": "text/javascript"}

    def __init__(self, *args, models_dir: str, **kwargs):
        self._models_dir = models_dir
        super().__init__(*args, directory=WEB, **kwargs)

    def translate_path(self, path):
        if path.startswith("/models/"):
            name = os.path.basename(path.split("?", 1)[0])
            return os.path.join(self._models_dir, name)
        return super().translate_path(path)

    def log_message(self, *args):  # keep test output quiet
        pass


@contextlib.contextmanager
def serve(models_dir: str):
    handler = functools.partial(_Handler, models_dir=models_dir)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_in_chromium(tflite: bytes, inputs: dict, signature: str | None = None, timeout: float = 180,
                    snippet: str | None = None) -> dict:
    """Run ``tflite`` on LiteRT.js's wasm accelerator in headless Chromium; {output name: ndarray}.

    ``snippet``: the web target's ES module text; when given, the page imports it and runs the model
    through its ``load``/``run`` instead of its own code.
    """
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "model.tflite"), "wb") as f:
            f.write(tflite)
        if snippet is not None:
            with open(os.path.join(tmp, "model.js"), "w") as f:
                f.write(snippet)
        spec = {k: {"dtype": str(np.asarray(v).dtype), "shape": list(np.asarray(v).shape),
                    "data": np.asarray(v).ravel().tolist()} for k, v in inputs.items()}
        inputs_path = os.path.join(tmp, "inputs.json")
        with open(inputs_path, "w") as f:
            json.dump(spec, f)
        with serve(tmp) as base:
            cmd = ["node", os.path.join(WEB, "run_model.mjs"), f"{base}/runner.html", f"{base}/models/model.tflite",
                   inputs_path] + ([signature] if signature else [])
            if snippet is not None:
                cmd.append(f"--snippet={base}/models/model.js")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=WEB)
    if proc.returncode != 0:
        raise RuntimeError(f"run_model.mjs failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout)
    return {k: np.asarray(v["data"], dtype=v["dtype"]).reshape(v["shape"]) for k, v in out.items()}
