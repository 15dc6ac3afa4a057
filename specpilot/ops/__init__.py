"""Kernels, one folder per op: reference.py (plain torch, the truth) beside the fast path (triton.py)."""
