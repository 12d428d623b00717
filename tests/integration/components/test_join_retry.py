"""Joining through a flooded enrollment listener: a connection closed before its request left is tried again
(real TLS on loopback, a front that closes chosen connections before any TLS byte; it sleeps between tries)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpulayerd.net import ca, enroll
from tests.unit.test_enroll import _idir, _signer


@pytest.mark.asyncio
async def test_a_join_asks_again_when_a_connection_is_closed_before_its_request_is_sent(tmp_path: Path) -> None:
    """A flooded enrollment listener may close a connection before its handshake ends: the CA is fetched
    again, and the join sent again when it surely never left (the token is spent once)."""
    a, b = tmp_path / "a", tmp_path / "b"
    await asyncio.to_thread(ca.cluster_init, a, "lab", addresses=["127.0.0.1:1"])
    async with _signer(a) as (port, seen):
        accepted = 0

        async def front(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal accepted
            accepted += 1
            if accepted in (1, 3):  # the first CA fetch and the first join: closed before any TLS byte
                writer.close()
                return
            up_r, up_w = await asyncio.open_connection("127.0.0.1", port)

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
                dst.close()

            await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer), return_exceptions=True)

        server = await asyncio.start_server(front, "127.0.0.1", 0)
        front_port = server.sockets[0].getsockname()[1]
        try:
            token = await asyncio.to_thread(ca.new_token, a, addresses=[f"127.0.0.1:{front_port}"])
            joined = await asyncio.to_thread(ca.cluster_join, b, token)
        finally:
            server.close()
    assert joined.in_cluster and accepted == 4
    assert seen == ["/v1/enroll/ca", "/v1/enroll/join"]  # what the signer answered: one of each
    rows = await asyncio.to_thread(enroll.list_tokens, _idir(a))
    assert [(r.uses_left, r.used) for r in rows][-1] == (0, 1)
