"""The local API (unix socket), the peer API (mutual TLS) and their clients: the HTTP layer (aiohttp).

Outside this package aiohttp appears only as a type (``app/cluster/node.py`` keeps the peer site's runner).
"""
