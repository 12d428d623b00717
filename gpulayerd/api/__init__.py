"""The local API (unix socket) and its client: the only importers of aiohttp."""
