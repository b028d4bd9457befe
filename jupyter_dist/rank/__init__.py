"""What runs inside a rank kernel: the bootstrap before the first cell, the kernel app, its
bounded out-stream, metrics, and the user helpers ``info``/``shard``/``log``.
May import: the base and ``common``.
"""
