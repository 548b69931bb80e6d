"""AG-UI 1.0 itself, pure (no asyncio, no I/O): what the official Python SDK
defines and the protocol logic it lacks.

* :mod:`~agui_hub.agui.events` - the event and message models (pydantic v2,
  camelCase on the wire, unknown fields kept) and the fast ``validate_wire``;
* :mod:`~agui_hub.agui.sequence` - ``SequenceVerifier``, the 1.0 ordering rules;
* :mod:`~agui_hub.agui.chunks` - ``ChunkExpander``, ``*_CHUNK`` events into
  START / CONTENT / END;
* :mod:`~agui_hub.agui.patch` - RFC 6902 JSON Patch, applied in place with an
  undo log and bounded work, and ``StateLimits``;
* :mod:`~agui_hub.agui.messages` - ``MessageList``, a thread's messages with
  their indexes, and the message rules of snapshots and run inputs;
* :mod:`~agui_hub.agui.reducer` - ``ThreadState``, the fold of events into a
  thread's state, messages and runs, and ``compact()``, its snapshot;
* :mod:`~agui_hub.agui.documents` - ``StateDocuments``, the state document and
  activity contents alone, as a writer judges them.

Nothing here imports anything of the hub but :mod:`agui_hub.errors`.
"""
