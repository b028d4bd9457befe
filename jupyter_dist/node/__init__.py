"""The per-node agent process (``python -m jupyter_dist.node``): forks this node's rank
kernels, watches them, and answers the control plane over JSON lines on stdin/stdout.
May import: the base, ``common`` and ``rank`` (a forked child becomes a rank kernel).
"""
