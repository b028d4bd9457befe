"""What runs inside a rank kernel: the bootstrap before the first cell, the kernel app, its
bounded out-stream, metrics, the user helpers ``info``/``shard``/``log``, a torchrun
script's own ``init_process_group`` (``process_group``) and JAX's cluster (``jax_cluster``).
May import: the base and ``common``.
"""
