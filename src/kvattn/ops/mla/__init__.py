"""MLA kernel family: latent-cache decode (Triton and Gluon kernels, launch, configs, op)."""
