"""One litert-torch 0.10.0 `export_hf` conversion (the peer) in a fresh process, run by bench/llm.py inside the
peer's venv (.bench-venv-peer-lm: litert-torch owns the module name `litert_torch`, and export_hf imports
TensorFlow, which it does not declare).

Usage: python bench/_llm_peer_worker.py MODEL_DIR OUT_DIR PREFILL CACHE RECIPE  -> prints one JSON line.
RECIPE is an ai-edge-quantizer recipe name (dynamic_wi8_afp32, ...) or "none" (the peer's default is int8, so
float must be asked for). The bundle is OUT_DIR/model.litertlm; a model the peer refuses prints
{"error": "<its exception type>: <its message>"} (the traceback goes to stderr) and exits 1. Wall time and peak RSS
of the whole process tree are measured by the parent; this reports the split between imports and the export.
"""

import json
import sys
import time
import traceback


def _where(e: BaseException) -> str:
    """The innermost frame in litert_torch's or transformers' own code (torch's checks raise far below them)."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if "/litert_torch/" in f.filename or "/transformers/" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    pkg = "litert_torch" if "/litert_torch/" in f.filename else "transformers"
    return f" (at {pkg}/{f.filename.rsplit('/' + pkg + '/', 1)[1]}:{f.lineno} in {f.name})"


def main():
    model_dir, out_dir, prefill, cache, recipe = sys.argv[1:6]
    t0 = time.perf_counter()
    # the PyPI package litert-torch (this runs in its venv), not our tpu_export.litert_torch facade
    from litert_torch.generative.export_hf import export as export_lib

    t1 = time.perf_counter()
    try:
        export_lib.export(model=model_dir, output_dir=out_dir, prefill_lengths=[int(prefill)],
                          cache_length=int(cache), quantization_recipe=recipe)
    except Exception as e:  # noqa: BLE001 - any refusal of the peer's is a result: its type and message, one line
        traceback.print_exc()
        msg = " ".join(str(e).split())[:300]
        print(json.dumps({"error": f"{type(e).__name__}: {msg}{_where(e)}", "import_s": t1 - t0}), flush=True)
        sys.exit(1)
    t2 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "export_s": t2 - t1, "bundle": f"{out_dir}/model.litertlm"}), flush=True)


if __name__ == "__main__":
    main()
