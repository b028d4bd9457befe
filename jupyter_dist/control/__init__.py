"""The control plane, which owns sessions: launchers, the agent client, rank clients, cell
tracking, the rendezvous and rank env, `Session` and `SessionManager`. asyncio only.
May import: the base and ``common``; no IPython, tornado, jupyter_server or widgets.
"""
