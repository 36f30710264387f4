"""Post-training weight-only quantization (int8 per channel, int4 group-wise).

- config.py: the `quantization` section of a quantized folder's config.json
- linear.py: the dense / w8 / w4 linear layers the model builds from its checkpoint
- rtn.py, gptq.py: round-to-nearest and GPTQ quantizers
- calibration.py: the calibration and held-out evaluation texts (Python stdlib docstrings)
- quantize.py: `inflight quantize` (a model folder in, a quantized model folder out)

NOTE: this file imports nothing: engine.model imports config/linear, and quantize imports
engine.model, so a package-level import here would close a cycle.
"""
