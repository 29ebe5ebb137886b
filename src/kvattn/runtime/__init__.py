"""Everything between the public functions and the kernel families that is not a kernel: the call
cache (callcache), backend choice (backend), environment switches (env), device facts (device),
Triton version gates (versions), the launcher (fast_launch), launch plans and config overrides
(plans), workspace carving (workspace), PTX hints (ptx_hints), the torch ops' one declaration each
(opdecl) and the host pieces the families' plans share (common). See docs/extending.md for the layers."""
