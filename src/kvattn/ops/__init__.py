"""Triton kernel families. Importing this package registers their torch ops."""
