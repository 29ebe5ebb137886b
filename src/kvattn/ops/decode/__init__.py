"""Decode kernel family: split-KV paged and single-request decode (kernels, launch, configs, op)."""
