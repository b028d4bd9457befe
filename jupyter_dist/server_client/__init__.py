"""The notebook kernel as the server extension's client: finding the server that launched
the kernel, its REST client, and the sessions the server owns as the kernel drives them.
May import: the base, ``common`` and ``control``; never ``server`` (it runs in another process).
"""
