"""Hostile inputs on every way in (model directories, shard indexes, tokenizer files, ONNX, .litertlm bundles,
generate's arguments), each built in its test, and the safe outcome asserted."""
