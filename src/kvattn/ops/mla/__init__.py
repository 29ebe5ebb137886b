"""MLA kernel family: latent-cache decode (the Triton kernel kernels.py, the Gluon kernels
kernels_gluon.py and kernels_gluon_ws.py, configs.py, plan.py, op.py)."""
