"""The hub's own protocol, sans I/O: what travels between a gateway and its
clients, as bytes and values, with no sockets and no event loop.

* :mod:`~agui_hub.wire.offsets` - ``Offset``, its order, thread names;
* :mod:`~agui_hub.wire.codec` - msgpack and JSON encodings with size limits;
* :mod:`~agui_hub.wire.protocol` - protocol v1: commands in, frames out, close
  codes, subprotocols (docs/protocol.md is its specification);
* :mod:`~agui_hub.wire.sse` - the Server-Sent Events format, parsed and written.
"""
