"""What runs inside a rank kernel: the bootstrap before the first cell, the kernel app, its
bounded out-stream, IOPub at its sender's pace (``iopub_credit``) with the widget updates
a later one replaces left unsent (``superseded_updates``), metrics, the user helpers
``info``/``shard``/``log``, a torchrun script's own ``init_process_group``
(``process_group``), a group a cell destroyed made again before the next
(``group_renewal``) with frameworks' cached state kept consistent (``framework_state``),
and JAX's cluster (``jax_cluster``).
May import: the base and ``common``.
"""
