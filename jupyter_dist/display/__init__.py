"""Drawing a cell for people: prefixed text, and the widget cell view with its parts (status
chips, per-rank outputs, live charts, relayed rank widgets, the stacks button).
May import: the base and ``common``.
"""
