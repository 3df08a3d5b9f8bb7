"""The hub: copies of many clients' journals in one place, sej's ``hub``.

A client pushes its journals' own bytes (``protocol.Push``); the hub checks every message, skips
what it holds, refuses a gap, appends and syncs before it answers with the offset it now holds
(``store.HubStore``). The client (``client.Pusher``) follows local journals, plain or sharded, and
resumes from what the hub says it holds, so that either side may die at any moment.
"""

from journalq.hub.protocol import Held, Push, PushResult, check_client_id, check_journal_name, copy_dir_name
from journalq.hub.source import RawReader, RawRun
from journalq.hub.store import HubStore

__all__ = [
    "Held",
    "HubStore",
    "Push",
    "PushResult",
    "RawReader",
    "RawRun",
    "check_client_id",
    "check_journal_name",
    "copy_dir_name",
]
