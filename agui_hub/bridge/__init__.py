"""Runs of existing AG-UI agents through the hub: the upstream side of the HTTP
bridge (docs/bridge.md).

* :mod:`~agui_hub.bridge.agents` - the named agents a gateway may run
  (``--agents``, ``--agents-file``);
* :mod:`~agui_hub.bridge.runs` - ``Bridge``: POST a ``RunAgentInput`` to an
  agent, read its SSE answer, and store every event through a
  :class:`~agui_hub.bridge.runs.ThreadSink` (the gateway's channels).

The bridge sits below the gateway: the gateway's ``run`` command and its
``POST /agents/<name>`` route are served by it, and it writes through the
small ``ThreadSink`` seam rather than importing the gateway.
"""
