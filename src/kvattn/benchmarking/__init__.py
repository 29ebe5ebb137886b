"""The benchmark harness both commands share: ``kvattn bench`` (:mod:`kvattn.bench`, on the built-in
problems, on a user's machine) and the repository's ``benchmarks/run.py`` (the shape registry, suites,
FlashInfer / SDPA / Flex peers on paged inputs, ceilings, A/B variants, sweep and reports).

- :mod:`~kvattn.benchmarking.timing`: do_bench medians with L2 flushed, CUDA-graph replay, input
  rotation, the host-timed CPU fallback.
- :mod:`~kvattn.benchmarking.inputs`: random paged pools and page tables drawn on the device, gathers.
- :mod:`~kvattn.benchmarking.measure`: one timed implementation (``Variant``) measured into a record;
  the output check; errors as one line, and which of them leave the CUDA context unusable.
- :mod:`~kvattn.benchmarking.records`: the results document's environment, headline time, JSON writer.
- :mod:`~kvattn.benchmarking.availability`: a peer that cannot run here (``NotAvailable``), torch's
  refusals read into one.
- :mod:`~kvattn.benchmarking.table`: the console tables.
- :mod:`~kvattn.benchmarking.builtin`, :mod:`~kvattn.benchmarking.torch_peers`: ``kvattn bench``'s
  problems and its torch peers on contiguous inputs.

Nothing here imports the repository's ``benchmarks/`` (it does not ship); the layers are in
``docs/layout.md``.
"""
