"""Pieces shared by the FP8 GEMM plugins."""

# The weight layout both plugins read (see layout.py); bump the version when the layout changes.
LAYOUT_ID = "tile_shuffled_fp8/v1"
