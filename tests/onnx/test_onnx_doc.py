"""docs/onnx_ops.md is generated from the importer's table and must be current."""

from tests.write_onnx_ops_doc import PATH, render


def test_onnx_ops_doc_is_current():
    with open(PATH, encoding="utf-8") as f:
        assert f.read() == render(), "docs/onnx_ops.md is stale: run `python -m tests.write_onnx_ops_doc`"
