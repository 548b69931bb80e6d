"""The fan-out core: one :class:`~agui_hub.gateway.fanout.channels.ThreadChannel`
per live thread, owned by the process's :class:`~agui_hub.gateway.fanout.channels.Hub`.

* :mod:`~agui_hub.gateway.fanout.channels` - ``Hub`` and ``ThreadChannel``:
  start, live delivery, joins and snapshots (read this first);
* :mod:`~agui_hub.gateway.fanout.members` - what a subscriber is and the
  phases of a member;
* :mod:`~agui_hub.gateway.fanout.history` - a channel's (re)load: its
  checkpoint and the events after it, folded;
* :mod:`~agui_hub.gateway.fanout.entries` - decoding, folding and encoding
  stored entries, once per encoding;
* :mod:`~agui_hub.gateway.fanout.recent` - the latest entries kept for joins
  and catch-ups, bounded per channel and per hub;
* :mod:`~agui_hub.gateway.fanout.catchup` - members reading history until they
  reach the channel's cursor;
* :mod:`~agui_hub.gateway.fanout.checkpoints` - writing a thread's folded
  state back to the store now and then.

Nothing here knows sockets: a subscriber is anything with an ``encoding`` and
a non-blocking ``send(frame) -> bool``.
"""
