"""Integrations with other libraries. Each submodule imports its library only when used, so
``import te_cudnn`` never imports them (they are optional extras):

* :mod:`te_cudnn.integrations.transformers`: ``register()`` makes ``attn_implementation="te_cudnn"``
  available to Hugging Face transformers models (extra ``te_cudnn[hf]``).
"""

__all__: list[str] = []
