"""Launch machinery shared by the kernel families: fast launches, PTX hints, host-side pieces."""
