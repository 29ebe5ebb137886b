"""KV-cache append kernel family: new tokens' K/V rows written into their pages, quantised on the
way for fp8 and NVFP4 caches (kernels.py, plan.py, op.py)."""
