"""The quantize section: FP8 PTQ with ModelOpt and its gate (quantization.py, modelopt_fp8.py,
evaluation.py), the export's dtype and its independent check (export_dtype.py, export_check.py),
the recipe section (config.py) and the stage adapter (stage.py)."""
