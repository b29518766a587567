"""Checkpoint -> verified ONNX artifact, one module per job (shipped as `lsan.export`).

graph.py     the PyTorch model -> fp32 ONNX graph of the device contract
quantize.py  fp32 ONNX -> each format (fp16, int8, int8-static, int4)
verify.py    each format against PyTorch, alone vs in a batch, and on the test split
place.py     where the artifact goes: refusals, temporary folders, the swap into place
export.py    the command: `python export/export.py CKPT --out DIR`
"""


class ExportError(RuntimeError):
    """The export failed, its verification did not pass, or --out is not safe to write."""
