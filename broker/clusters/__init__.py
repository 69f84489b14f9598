"""Dispatch and the cluster link: each connected agent's session, its messages as domain types, and the
outbox orders (Dispatch, Start, Cancel, holds) sent down to it.

Never imports the scheduling loop or the API edge; it hears the placer through domain events.
"""
