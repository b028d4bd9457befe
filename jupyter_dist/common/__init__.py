"""Values and wire formats every process shares: specs, hosts, events, the agent protocol,
pickling, stacks, GPUs, ports. Runs anywhere (notebook, server, agent, rank).
May import: the base (``errors``, ``settings``, ``text``); no IPython, tornado or torch at import.
"""
