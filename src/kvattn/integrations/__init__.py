"""Glue between kvattn and model libraries (imported on demand; each needs its library installed).

* :mod:`kvattn.integrations.transformers`: Hugging Face transformers' attention interface and
  its paged continuous batching (``model.generate_batch``).
"""
