"""Code shared by every service and the client: config, logging, server bootstrap, auth, errors.

Nothing here imports a heavy library at module level, so the client-only
install can use it.
"""
