"""CPU schedule of the blocked scans (te_defs/scan.py, te_defs/indexing.py ``blocked_scan``): their
three phases are annotated blocks (chunk reductions and chunk rescans parallel over columns ×
chunks, the carry scan parallel over columns), scheduled by the ``idx_serial`` rules."""

from .idx_serial import schedule

__all__ = ["schedule"]
