"""The jupyter-server extension: the app that owns a `SessionManager` under a server, its
REST handlers, the records its successor reaps from, and the OpenAPI file.
May import: the base, ``common`` and ``control``.
"""
