"""Runs of existing AG-UI agents through the hub: the upstream side of the HTTP
bridge (docs/bridge.md).

* :mod:`~agui_hub.bridge.agents` - the named agents a gateway may run
  (``--agents``, ``--agents-file``);
* :mod:`~agui_hub.bridge.runs` - ``Bridge``: starts, cancels and closes the
  runs of one gateway, one per thread;
* :mod:`~agui_hub.bridge.upstream` - ``UpstreamRelay``: POST a
  ``RunAgentInput`` to an agent and relay its SSE answer, its failures turned
  into one ``UpstreamError``;
* :mod:`~agui_hub.bridge.recorder` - ``RunRecorder``: store a run's events in
  its thread, and its RUN_ERROR when it fails;
* :mod:`~agui_hub.bridge.bridged_run` - ``BridgedRun``, the record of one run;
* :mod:`~agui_hub.bridge.sink` - ``ThreadSink``, what the bridge needs of the
  gateway's channels.

The bridge sits below the gateway: the gateway's ``run`` command and its
``POST /agents/<name>`` route are served by it, and it writes through the
small ``ThreadSink`` seam rather than importing the gateway.
"""
