"""Decode kernel family: split-KV paged and single-request decode (kernels.py, configs.py, plan.py,
op.py; ragged drafts: kernels_ragged.py and their host side ragged.py)."""
