"""``vm://name``: a connection to a broker in this process (kittiwake.embedded), started on
first use and shared by every vm:// connection of that name, through in-memory pipes (the
AMQP engine on both sides, no socket). The one place the client library reaches into the
broker package, and only when a vm:// URL is used.
"""

from __future__ import annotations

import asyncio


async def open_streams(name: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    from kittiwake.embedded import embedded_broker  # only for vm:// (see the module text)

    loop = asyncio.get_running_loop()
    # Starting the broker blocks until it is ready: not on this loop.
    broker = await loop.run_in_executor(None, embedded_broker, name)
    return await broker.open_pipe()
