"""The gateway: fan-out, checked writes and the servers.

* :mod:`~agui_hub.gateway.fanout.channels` - ``Hub`` and ``ThreadChannel``: one
  channel per live thread, catch-up then live with no gap, each event encoded
  once per encoding; its collaborators beside it: :mod:`~.members`,
  :mod:`~.history` (the (re)load), :mod:`~.checkpoints`, :mod:`~.recent`
  (the latest entries in memory), :mod:`~.catchup`, :mod:`~.entries`;
* :mod:`~agui_hub.gateway.writer` - ``ThreadWriter``: validate, verify the
  sequence, append (the one write path);
* :mod:`~agui_hub.gateway.auth` - identities, grants, tokens (sans I/O);
* :mod:`~agui_hub.gateway.config` - ``GatewayConfig``, every setting;
* :mod:`~agui_hub.gateway.server` - ``Gateway``: the WebSocket server and
  its lifecycle, with one module per concern beside it;
* :mod:`~agui_hub.gateway.web` - the HTTP/SSE listener;
* :mod:`~agui_hub.gateway.metrics` and :mod:`~agui_hub.gateway.workers` -
  Prometheus figures, ``serve --workers N``.

    from agui_hub.gateway.server import Gateway
    from agui_hub.gateway.config import GatewayConfig
"""
