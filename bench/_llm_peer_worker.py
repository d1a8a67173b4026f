"""One litert-torch 0.10.0 `export_hf` conversion (the peer) in a fresh process, run by bench/llm.py inside the
peer's venv (.bench-venv-peer-lm: litert-torch owns the module name `litert_torch`, and export_hf imports
TensorFlow, which it does not declare).

Usage: python bench/_llm_peer_worker.py MODEL_DIR OUT_DIR PREFILL CACHE RECIPE  -> prints one JSON line.
RECIPE is an ai-edge-quantizer recipe name (dynamic_wi8_afp32, ...) or "none" (the peer's default is int8, so
float must be asked for). The bundle is OUT_DIR/model.litertlm. Wall time and peak RSS of the whole process tree
are measured by the parent; this reports the split between imports and the export itself.
"""

import json
import sys
import time


def main():
    model_dir, out_dir, prefill, cache, recipe = sys.argv[1:6]
    t0 = time.perf_counter()
    from tpu_export.litert_torch.generative.export_hf import export as export_lib

    t1 = time.perf_counter()
    export_lib.export(model=model_dir, output_dir=out_dir, prefill_lengths=[int(prefill)], cache_length=int(cache),
                      quantization_recipe=recipe)
    t2 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "export_s": t2 - t1, "bundle": f"{out_dir}/model.litertlm"}), flush=True)


if __name__ == "__main__":
    main()
