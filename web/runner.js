// Runs a .tflite in the page with LiteRT.js on the wasm (XNNPACK) accelerator.
// window.runModel(modelUrl, inputs, signature) -> {outputName: {dtype, shape, data}};
// inputs is {inputName: {dtype, shape, data}} with data a flat array in row-major order.
import {loadLiteRt, loadAndCompile, Tensor} from '@litertjs/core';

// The tensor dtypes LiteRT.js 2.5.3 can build from a TypedArray (its DATATYPES table).
const TYPED = {float32: Float32Array, int32: Int32Array, uint8: Uint8Array};

let ready = null;

function init() {
  // The wasm files come from the npm package, served by the local test server.
  if (!ready) ready = loadLiteRt('/node_modules/@litertjs/core/wasm/');
  return ready;
}

async function runModel(modelUrl, inputs, signature) {
  await init();
  const model = await loadAndCompile(modelUrl, {accelerator: 'wasm'});
  const runner = signature ? model.signatures[signature] : model;
  const named = {};
  for (const [name, spec] of Object.entries(inputs)) {
    const Typed = TYPED[spec.dtype];
    if (!Typed) throw new Error(`input ${name}: dtype ${spec.dtype} is not handled by this page`);
    named[name] = new Tensor(Typed.from(spec.data), spec.shape);
  }
  const results = await runner.run(named);
  const out = {};
  for (const [name, tensor] of Object.entries(results)) {
    const arr = tensor.toTypedArray();
    out[name] = {
      dtype: tensor.type.dtype,
      shape: Array.from(tensor.type.layout.dimensions),
      data: Array.from(arr),
    };
    tensor.delete();
  }
  for (const t of Object.values(named)) t.delete();
  model.delete();
  return out;
}

// Runs the ES module the web target writes (targets/web.py): its load() and run(), as a user would.
async function runSnippet(moduleUrl, modelUrl, inputs, signature) {
  await init();
  const mod = await import(moduleUrl);
  const model = await mod.load(modelUrl, '/node_modules/@litertjs/core/wasm/');
  const typed = {};
  for (const [name, spec] of Object.entries(inputs)) typed[name] = TYPED[spec.dtype].from(spec.data);
  const results = await mod.run(model, typed, signature || mod.DEFAULT_SIGNATURE);
  const sig = mod.SIGNATURES[signature || mod.DEFAULT_SIGNATURE];
  const out = {};
  for (const o of sig.outputs) out[o.name] = {dtype: o.dtype, shape: o.shape, data: Array.from(results[o.name])};
  model.delete();
  return out;
}

window.runModel = runModel;
window.runSnippet = runSnippet;
init().then(
  () => { document.getElementById('status').textContent = 'ready'; window.liteRtReady = true; },
  (e) => { document.getElementById('status').textContent = 'error: ' + e; window.liteRtError = String(e); },
);
