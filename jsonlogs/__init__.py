"""Structured JSON logs: one JSON object per line on stderr, with fixed keys (python-json-logger).

The one definition of the log format: the broker and the extender / agent processes both configure their
root logger with `configure_json_logging` (a library beside the shells, importing none of them). The keys:

* ``time``: when the record was made, RFC 3339 in UTC with milliseconds, e.g. ``2025-01-31T12:00:00.123Z``.
* ``level``: the level name (``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``, ``CRITICAL``).
* ``logger``: the logger's name (``tandem.broker.placer``, ``tandem.extender``, ``tandem.agent``, ...).
* ``message``: the message; kept constant per event, so the data goes in the fields below.
* ``exc_info``: the formatted traceback, only on records logged with an exception.
* every ``extra=`` field of the call as a top-level key (``job``, ``attempt``, ``pod``, ``node``, ``cluster``,
  ``error``, ``detail``, ...), values as JSON (anything else as its ``str``). An extra never replaces one of the
  four fixed keys. ``job`` is the correlation key: the job id from submission (broker) through dispatch to the
  pods (agent; the pods' ``tandem.dev/job`` label), with ``attempt`` naming the try.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Any

from pythonjsonlogger.json import JsonFormatter

__all__ = ["FIXED_KEYS", "JsonLineFormatter", "configure_json_logging", "rfc3339"]

FIXED_KEYS = ("time", "level", "logger", "message")
"""The keys every line has, in this order."""


def rfc3339(created: float) -> str:
    """A record's ``created`` time as RFC 3339 UTC with milliseconds (``...T12:00:00.123Z``)."""
    moment = datetime.datetime.fromtimestamp(created, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonLineFormatter(JsonFormatter):
    """python-json-logger's formatter with the fixed keys first; the library adds ``exc_info`` and the extras."""

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        # format() has set record.message (empty when the message is a dict of fields, which the library merges).
        fixed = {
            "time": rfc3339(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.message,
        }
        log_data.update(fixed)  # first, so they lead the line
        super().add_fields(log_data, record, message_dict)
        log_data.update(fixed)  # and last, so no extra replaces them


def configure_json_logging(level: str | int) -> logging.Handler:
    """Make the root logger write JSON lines (the keys above) to stderr at ``level``; returns its one handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
