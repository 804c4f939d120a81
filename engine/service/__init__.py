"""The histlog HTTP service (``histlog serve``) and what its server and clients share.

``problems`` is the one map between histlog's errors and HTTP statuses / problem+json bodies: the
server renders errors with it and the clients raise from it, so both always agree.
"""
