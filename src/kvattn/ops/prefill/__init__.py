"""Prefill kernel family: paged causal context attention (the Triton kernel kernels.py, the
warp-specialised Gluon kernel kernels_gluon_ws.py and its host side plan_gluon_ws.py, the page
staging kernels_staging.py and staging.py, configs.py, plan.py, op.py)."""
