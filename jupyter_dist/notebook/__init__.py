"""The IPython side, in the notebook kernel: the magics, the loop that drives a running
cell, and the choice of who owns this kernel's sessions (the server or the kernel).
May import: every role but ``server``, ``node`` and ``rank``, which run in other processes.
"""
