"""Runs of upstream agents as the gateway's clients reach them: every start,
cancel and end checked against the caller's grants before the bridge acts.

A ``run`` or ``cancel`` command (:mod:`~agui_hub.gateway.commands`) and the
HTTP listener's ``POST /agents/<name>`` and ``DELETE /threads/<thread>/run``
(:mod:`~agui_hub.gateway.web`) ask here; the :class:`~agui_hub.bridge.runs.Bridge`
itself knows nothing of identities (docs/bridge.md).
"""

from __future__ import annotations

from ..bridge.runs import Bridge, BridgedRun
from ..errors import Forbidden
from ..wire.protocol import Run
from .auth import Action, Identity

__all__ = ["RunAccess", "require_publish"]


def require_publish(identity: Identity | None, thread: str) -> Identity:
    """*identity*, if it may publish into *thread*; else :class:`~agui_hub.errors.Forbidden`."""
    if identity is None or not identity.allows(Action.PUBLISH, thread):
        raise Forbidden(f"this connection may not publish into thread {thread!r}")
    return identity


class RunAccess:
    """The gateway's :class:`~agui_hub.bridge.runs.Bridge`, behind its clients' grants.

    A run belongs to a thread: starting, cancelling or ending one takes a
    grant to publish into it, and starting one a run grant covering the agent.
    Each method raises :class:`~agui_hub.errors.Forbidden` (say so to the
    client) when the identity lacks them, and otherwise what the bridge raises.
    """

    __slots__ = ("bridge",)

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge

    def runnable(self, identity: Identity | None, thread: str) -> list[str]:
        """The agents *identity* may run in *thread*, by name (none without the grants)."""
        if identity is None or not identity.allows(Action.PUBLISH, thread):
            return []
        return sorted(name for name in self.bridge.agents if identity.grants.may_run(name))

    def check_grant(self, identity: Identity | None, agent: str, thread: str) -> None:
        """Raise :class:`~agui_hub.errors.Forbidden` unless *identity* may run *agent*
        in *thread* (publish into the thread, and a run grant covering the agent)."""
        identity = require_publish(identity, thread)
        if not identity.grants.may_run(agent):
            raise Forbidden(f"this connection may not run agent {agent!r} (its run grant)")

    async def start(self, identity: Identity | None, command: Run) -> BridgedRun:
        """Start the run a ``run`` command asks for (see :meth:`Bridge.start`)."""
        self.check_grant(identity, command.agent, command.thread)
        assert identity is not None  # checked above
        return await self.bridge.start(
            command.agent,
            command.thread,
            subject=identity.subject,
            messages=command.messages,
            state=command.state,
            tools=command.tools,
            context=command.context,
            forwarded_props=command.forwarded_props,
            run_id=command.run_id,
            parent_run_id=command.parent_run_id,
        )

    def cancel(self, identity: Identity | None, thread: str, run_id: str | None) -> BridgedRun:
        """Cancel the bridged run in *thread*: for identities that may publish into it.
        Await the returned run's ``done`` before telling the client it ended."""
        identity = require_publish(identity, thread)
        return self.bridge.cancel(thread, by=identity.subject, run_id=run_id)

    async def end_abandoned(
        self, identity: Identity | None, thread: str, run_id: str | None
    ) -> str:
        """End the run *thread* holds open that no gateway relays (see
        :meth:`Bridge.end_abandoned`): for identities that may publish into it.
        Returns the run's id."""
        identity = require_publish(identity, thread)
        return await self.bridge.end_abandoned(thread, by=identity.subject, run_id=run_id)
