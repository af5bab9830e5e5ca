"""Networking shared by fulgor's servers and clients.

:mod:`~fulgor.net.sockets` binds listening sockets, :mod:`~fulgor.net.asgi` runs an ASGI app with
uvicorn on one, :mod:`~fulgor.net.http_client` is the keep-alive HTTP/1.1 client that the store client
and the gateway call out with, and :mod:`~fulgor.net.http_server` is the small HTTP/1.1 server behind
the runner's reward endpoint and the scripted OpenAI server. None of them knows about stores, rollouts
or models.
"""
