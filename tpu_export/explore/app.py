"""explore(): an artifact in Model Explorer on localhost, with overlays; or a self-contained HTML / PNG view."""

from __future__ import annotations

import html
import json
import os
import socket
import tempfile
import threading
import time
import urllib.request

from .graphs import artifact_kind
from .overlays import overlay_path, overlay_paths

__all__ = ["ExploreError", "View", "build_view", "explore", "serve", "render_png", "export_html"]


class ExploreError(RuntimeError):
    """explore() cannot do what was asked (Model Explorer missing, a port taken, an overlay not found)."""


class View:
    """What Model Explorer is given: the model sources, the graphs built here, and the overlays."""

    def __init__(self, artifact: str, kind: str):
        self.artifact = artifact
        self.kind = kind
        self.models: list = []  # (name, path or None, graphs JSON dict or None)
        self.overlays: dict = {}  # name -> path
        self.files: list = []  # files written for the view (the .mlir texts, graph JSON)

    def graphs(self) -> list:
        """Model Explorer's graph JSON of every model of the view (its adapters' output)."""
        import ai_edge_model_explorer_adapter as adapter

        out = []
        for name, path, graphs in self.models:
            if graphs is None:
                cols = json.loads(adapter.ConvertFlatbufferDirectlyToJson(adapter.VisualizeConfig(), path))
                graphs = {"graphCollections": [{"label": c["label"], "graphs": c.get("subgraphs", [])}
                                               for c in cols]}
            out.append((name, graphs))
        return out


def _require_model_explorer():
    try:
        import ai_edge_model_explorer_adapter  # noqa: F401
        import model_explorer  # noqa: F401
    except ImportError:
        raise ExploreError("Model Explorer is not installed: pip install 'tpu-export[explore]' "
                           "(PyPI ai-edge-model-explorer)") from None


def _resolve_overlays(artifact: str, overlays) -> dict:
    found = overlay_paths(artifact)
    out = {}
    for o in overlays or ():
        if o == "all":
            out.update(found)
        elif o.endswith(".json") or os.sep in o:
            if not os.path.isfile(o):
                raise ExploreError(f"overlay file {o!r} does not exist")
            out[os.path.basename(o)[: -len(".json")] if o.endswith(".json") else o] = o
        elif o in found:
            out[o] = found[o]
        else:
            have = ", ".join(found) or "none"
            raise ExploreError(f"overlay {o!r} not found beside {artifact} (expected {overlay_path(artifact, o)}; "
                               f"written there: {have}); write it with `tpu-export inspect ARTIFACT --overlays` or "
                               "`tpu-export compare MODEL ARTIFACT --overlays`")
    return out


def build_view(artifact, *, overlays=(), model=None, sample_args=(), sample_kwargs=None, workdir=None) -> View:
    """Prepare ``artifact`` for Model Explorer (see graphs.py for what each kind becomes).

    Args:
        artifact: A .tflite, a .litertlm, or a TPU artifact (.tpuexp folder or .zip).
        overlays: Overlay names written beside the artifact (``runs_on.gpu``, ``latency``, ``numeric``...),
            ``"all"``, or paths of node data JSON files.
        model: For a TPU artifact, the torch model it came from (with ``sample_args``): the view then ties each
            StableHLO op to its torch node and source line (a debug export of the signature).
        sample_args: The model's sample inputs.
        sample_kwargs: Its keyword inputs.
        workdir: Where the view's own files go (default: a new temporary folder).

    Returns:
        The View.
    """
    path = os.path.abspath(os.fspath(artifact))
    if not os.path.exists(path):
        raise FileNotFoundError(f"artifact {path!r} does not exist")
    kind = artifact_kind(path)
    view = View(path, kind)
    view.overlays = _resolve_overlays(path, overlays)
    costed = [o for o in view.overlays if o.startswith("xla_cost.")]
    if costed and model is not None:
        # node ids of the artifact's own program; the view with model= shows the debug export, another program
        raise ExploreError(f"overlay {costed[0]!r} is keyed by the node ids of the artifact's own view; the view "
                           "with the torch model (model=, --model) is a debug export with other ids: open it "
                           "without the model")
    if kind in ("tflite", "litertlm"):
        if model is not None:
            raise ValueError("model= applies to TPU artifacts: a .tflite's tensors already carry the torch names")
        view.models.append((os.path.basename(path), path, None))
        return view
    _require_model_explorer()
    from .graphs import annotate_mlir, debug_mlir, mlir_graphs, stablehlo_text, tpu_graph_id

    workdir = workdir or tempfile.mkdtemp(prefix="tpu-export-explore-")
    os.makedirs(workdir, exist_ok=True)
    from tpu_export.tpu_backend.artifact import read_artifact

    sigs = list(read_artifact(path).signatures)
    prog = None
    if model is not None:
        from .layerwise import _capture

        prog = _capture(model, sample_args if isinstance(sample_args, tuple) else (sample_args,), sample_kwargs)
    for sig in sigs:
        if prog is not None and sig in prog.signatures:
            text, notes, wn, inn = debug_mlir(prog, prog.signature(sig))
            label = f"{sig} (debug export)"
        else:
            raw, wn, inn = stablehlo_text(path, sig)
            text, notes = annotate_mlir(raw, wn, inn)
            label = sig
        mlir = os.path.join(workdir, f"{sig}.mlir")
        with open(mlir, "w") as f:
            f.write(text)
        graphs = mlir_graphs(mlir, notes, text, wn, inn, label)
        gid = tpu_graph_id(sigs, sig)
        for col in graphs["graphCollections"]:
            for g in col["graphs"]:
                if g.get("id") == "main":
                    g["id"] = gid
        gpath = os.path.join(workdir, f"{sig}.graph.json")
        with open(gpath, "w") as f:
            json.dump(graphs, f)
        view.files += [mlir, gpath]
        view.models.append((label, mlir, graphs))
    return view


def _config(view: View):
    import model_explorer

    cfg = model_explorer.config()
    for name, path, graphs in view.models:
        if graphs is None:
            cfg.add_model_from_path(path)
        else:
            cfg.graphs_list.append(json.dumps(graphs))
            cfg.model_sources.append({"url": f"graphs://{name}/{len(cfg.graphs_list) - 1}"})
    for p in view.overlays.values():
        cfg.add_node_data_from_path(p)
    return cfg


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _offline_version_check(print_msg=True) -> dict:
    # Model Explorer asks PyPI and GitHub for a newer release on start and from the page; the view is served
    # offline, so the answer is "no newer version" without a request.
    return {"version": "", "runningVersion": "", "releaseUrl": "", "desktopAppUrl": ""}


def serve(view: View, port: int = 8080, *, block: bool = True) -> str:
    """Serve ``view`` with Model Explorer on 127.0.0.1:``port``; the page's URL.

    ``block=False`` returns once the server answers, leaving it on a daemon thread (tests, --png)."""
    _require_model_explorer()
    from model_explorer import server

    if port == 8080:  # the default: the first free port from 8080 to 8099, as Model Explorer's own command does
        port = next((p for p in range(8080, 8100) if _free(p)), 0)
        if not port:
            raise ExploreError("ports 8080-8099 are all in use on 127.0.0.1; pick another with --port")
    elif not _free(port):
        raise ExploreError(f"port {port} is in use on 127.0.0.1; pick another with --port")
    cfg = _config(view)
    server._check_new_version = _offline_version_check  # noqa: SLF001 - see _offline_version_check
    url = f"http://127.0.0.1:{port}/?data={cfg.to_url_param_value()}"

    def run():
        server.start(host="127.0.0.1", port=port, config=cfg, no_open_in_browser=True, skip_health_check=True)

    if block:
        print(f"Model Explorer: {url}", flush=True)
        run()
        return url
    threading.Thread(target=run, daemon=True).start()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with opener.open(f"http://127.0.0.1:{port}/check_health", timeout=2) as r:
                if r.read() == b"model_explorer_ok":
                    return url
        except OSError:
            time.sleep(0.2)
    raise ExploreError(f"Model Explorer did not answer on port {port} within 30 s")


_READY = ("(() => { const t = document.body ? document.body.innerText : '';"
          " const m = t.match(/op node count\\s+(\\d+)/i);"
          " return m && !/Processing graph/i.test(t) ? Number(m[1]) : 0; })()")


def render_png(url: str, png: str, *, timeout: float = 90.0) -> dict:
    """Open ``url`` (a served view) in headless Chromium, wait for the graph, screenshot it into ``png``.

    Returns:
        {"op_node_count": the count Model Explorer shows, "png_bytes": the screenshot's size, "page_text": the page's
        text (the overlays' names among it, once Model Explorer has loaded them)}.
    """
    from .browser import Browser

    with Browser(url, timeout=timeout) as b:
        count = b.wait_for(_READY, timeout)
        time.sleep(1.0)  # the graph's WebGL canvas draws on the next frames
        size = b.screenshot(png)
        text = b.evaluate("document.body ? document.body.innerText : ''") or ""
    return {"op_node_count": int(count), "png_bytes": size, "page_text": text}


def _layers(graph: dict) -> dict:
    nodes = {n["id"]: n for n in graph.get("nodes", [])}
    depth: dict = {}

    def d(nid, seen=()):
        if nid in depth:
            return depth[nid]
        if nid in seen:
            return 0
        ins = [e["sourceNodeId"] for e in nodes[nid].get("incomingEdges", []) if e["sourceNodeId"] in nodes]
        depth[nid] = 1 + max((d(i, seen + (nid,)) for i in ins), default=-1)
        return depth[nid]

    for nid in nodes:
        d(nid)
    return depth


def export_html(view: View, path: str) -> str:
    """A self-contained HTML view (no network, no Model Explorer needed to open it): each graph drawn as SVG,
    its nodes coloured and labelled by the overlays, a table of every node with its overlay values, and the
    Model Explorer graph JSON embedded (``<script type="application/json" id="graphs">``)."""
    from tpu_export.converter.untrusted import read_json

    overlays = {name: read_json(p, what=f"overlay {name!r}") for name, p in view.overlays.items()}
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             f"<title>{html.escape(os.path.basename(view.artifact))}</title>",
             "<style>body{font-family:sans-serif;margin:16px}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}svg{border:1px solid #ddd}</style>",
             "</head><body>", f"<h1>{html.escape(os.path.basename(view.artifact))}</h1>"]
    all_graphs = view.graphs()
    ids = {g.get("id") for _, graphs in all_graphs for col in graphs.get("graphCollections", [])
           for g in col.get("graphs", [])}
    for name, graphs in all_graphs:
        for col in graphs.get("graphCollections", []):
            for g in col.get("graphs", []):
                parts.append(_graph_html(name, g, overlays, ids))
    parts.append("<script type='application/json' id='graphs'>"
                 + json.dumps([g for _, g in all_graphs]).replace("</", "<\\/") + "</script>")
    parts.append("<script type='application/json' id='overlays'>"
                 + json.dumps(overlays).replace("</", "<\\/") + "</script></body></html>")
    from tpu_export.converter.atomic import write_file

    write_file(path, "\n".join(parts).encode())
    return path


def _values(node: dict, gid: str, overlays: dict, ids: set) -> dict:
    keys = [node.get("id")] + [a["value"] for o in node.get("outputsMetadata", []) for a in o.get("attrs", [])
                               if a.get("key") == "tensor_name"]
    out = {}
    for name, data in overlays.items():
        # an overlay of one graph whose id the view does not have applies to any graph; one naming another graph
        # of the view (another signature) does not
        lone = next(iter(data.values())) if len(data) == 1 and next(iter(data)) not in ids else {}
        res = (data.get(gid) or lone or {}).get("results", {})
        for k in keys:
            if k in res:
                out[name] = res[k]
                break
    return out


def _graph_html(model: str, g: dict, overlays: dict, ids: set) -> str:
    gid = g.get("id", "")
    nodes = [n for n in g.get("nodes", []) if n.get("label") != "pseudo_const"]
    depth = _layers({"nodes": nodes})
    rows: dict = {}
    for n in nodes:
        rows.setdefault(depth[n["id"]], []).append(n)
    w, h, gap_x, gap_y = 200, 34, 20, 26
    width = max((len(r) for r in rows.values()), default=1) * (w + gap_x) + gap_x
    height = (max(rows, default=0) + 1) * (h + gap_y) + gap_y
    pos = {}
    svg = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-size='11'>"]
    for d, row in sorted(rows.items()):
        for i, n in enumerate(row):
            pos[n["id"]] = (gap_x + i * (w + gap_x), gap_y + d * (h + gap_y))
    for n in nodes:
        x, y = pos[n["id"]]
        for e in n.get("incomingEdges", []):
            if e["sourceNodeId"] in pos:
                sx, sy = pos[e["sourceNodeId"]]
                svg.append(f"<line x1='{sx + w / 2}' y1='{sy + h}' x2='{x + w / 2}' y2='{y}' stroke='#999'/>")
    first = next(iter(overlays), None)
    table = ["<table><tr><th>id</th><th>op</th><th>namespace</th>"
             + "".join(f"<th>{html.escape(o)}</th>" for o in overlays) + "</tr>"]
    for n in nodes:
        x, y = pos[n["id"]]
        vals = _values(n, gid, overlays, ids)
        color = (vals.get(first) or {}).get("bgColor", "#ffffff") if first else "#ffffff"
        label = html.escape(f"{n.get('label', '')} {n.get('namespace', '')}"[:34])
        svg.append(f"<g class='node' data-id='{html.escape(str(n['id']))}'><rect x='{x}' y='{y}' width='{w}' "
                   f"height='{h}' rx='4' fill='{html.escape(str(color))}' stroke='#555'/>"
                   f"<text x='{x + 4}' y='{y + 20}'>{label}</text></g>")
        table.append(f"<tr><td>{html.escape(str(n['id']))}</td><td>{html.escape(n.get('label', ''))}</td>"
                     f"<td>{html.escape(n.get('namespace', ''))}</td>"
                     + "".join(f"<td>{html.escape(str((vals.get(o) or {}).get('value', '')))}</td>" for o in overlays)
                     + "</tr>")
    svg.append("</svg>")
    table.append("</table>")
    return (f"<h2>{html.escape(model)}: {html.escape(gid)} ({len(nodes)} nodes)</h2>"
            + (f"<p>colours: overlay {html.escape(first)}</p>" if first else "") + "".join(svg) + "".join(table))


def explore(artifact, *, port: int = 8080, overlays=(), model=None, sample_args=(), sample_kwargs=None,
            export_html_path: str | None = None, png: str | None = None, block: bool = True) -> dict:
    """Open ``artifact`` in Model Explorer on localhost, or write a self-contained view of it.

    Args:
        artifact: A .tflite, a .litertlm, or a TPU artifact (.tpuexp folder or .zip).
        port: The local port Model Explorer listens on (127.0.0.1 only).
        overlays: Overlay names written beside the artifact (``tpu-export inspect --overlays``, ``tpu-export compare
            --overlays``), ``"all"``, or node data JSON paths.
        model: For a TPU artifact, the torch model it came from: its ops then carry torch node names and source lines.
        sample_args: The model's sample inputs (with ``model``).
        sample_kwargs: Its keyword inputs.
        export_html_path: Write a self-contained HTML view here instead of serving.
        png: Write a screenshot of Model Explorer's view here (headless Chromium) instead of serving.
        block: Serve until interrupted (False: return once the server answers).

    Returns:
        {"url": the page (when served), "html": path, "png": path, "op_node_count": the count Model Explorer
        showed (with png), "files": the view's own files (.mlir texts, graph JSON)}.

    Raises:
        ExploreError: Model Explorer is not installed, the port is taken, or an overlay is not found.
        FileNotFoundError: ``artifact`` does not exist.
        ValueError: ``artifact`` is not a kind explore opens.
    """
    from tpu_export.tpu_backend.aot import prepare_cpu_host

    prepare_cpu_host()
    view = build_view(artifact, overlays=overlays, model=model, sample_args=sample_args, sample_kwargs=sample_kwargs)
    out: dict = {"files": list(view.files)}
    if export_html_path:
        _require_model_explorer()
        out["html"] = export_html(view, export_html_path)
    if png:
        url = serve(view, port, block=False)
        out.update(render_png(url, png))
        out["png"] = png
        out["url"] = url
    if not export_html_path and not png:
        out["url"] = serve(view, port, block=block)
    return out
