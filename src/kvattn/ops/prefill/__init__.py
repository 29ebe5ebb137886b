"""Prefill kernel family: paged causal context attention (kernels, launch, configs, op)."""
