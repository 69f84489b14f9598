"""Structured JSON logs: what configure_json_logging's handler writes, line by line."""

from __future__ import annotations

import datetime
import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jsonlogs import FIXED_KEYS, configure_json_logging
from tests.extender.extender_support import Client, client  # noqa: F401

RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """The root logger configured as main() does, its handler writing to a buffer; restored afterwards."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    handler = configure_json_logging("INFO")
    assert root.handlers == [handler] and root.level == logging.INFO
    out = io.StringIO()
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(out)
    try:
        yield out
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def records(out: io.StringIO) -> list[dict[str, Any]]:
    parsed = [json.loads(line) for line in out.getvalue().splitlines()]
    assert all(isinstance(p, dict) for p in parsed)
    return parsed


def test_a_line_is_json_with_the_fixed_keys_then_every_extra(lines: io.StringIO) -> None:
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    extra = {
        "job_id": "j-1",
        "attempt": 2,
        "pod": "team-a/p-0",
        "node": "h100-r1-n2",
        "cluster": "a",
        "error": "boom",
        "detail": {"gpus": [0, 1], "ok": True},
    }
    logging.getLogger("tandem.extender.test").warning("attempt failed", extra=extra)
    (line,) = records(lines)
    assert list(line)[:4] == list(FIXED_KEYS) == ["time", "level", "logger", "message"]
    assert set(line) == set(FIXED_KEYS) | set(extra)
    assert line["level"] == "WARNING" and line["logger"] == "tandem.extender.test"
    assert line["message"] == "attempt failed"
    assert {k: line[k] for k in extra} == extra
    assert RFC3339_UTC.match(line["time"]), line["time"]
    moment = datetime.datetime.fromisoformat(line["time"])
    assert moment.utcoffset() == datetime.timedelta(0)
    assert before <= moment <= datetime.datetime.now(datetime.UTC)


def test_exceptions_are_text_under_exc_info(lines: io.StringIO) -> None:
    log = logging.getLogger("tandem.extender.test")
    try:
        raise ValueError("bad quantity")
    except ValueError:
        log.exception("request failed", extra={"pod": "team-a/p"})
    (line,) = records(lines)
    assert set(line) == set(FIXED_KEYS) | {"exc_info", "pod"}
    assert line["level"] == "ERROR" and line["pod"] == "team-a/p"
    assert isinstance(line["exc_info"], str)
    assert line["exc_info"].startswith("Traceback") and "ValueError: bad quantity" in line["exc_info"]


def test_levels_odd_values_and_fixed_keys_that_extras_cannot_replace(lines: io.StringIO) -> None:
    log = logging.getLogger("tandem.agent")
    log.debug("below the level")
    log.info("reading %s", "config", extra={"detail": Path("/etc/tandem"), "level": "spoofed", "time": 0})
    (line,) = records(lines)
    assert line["message"] == "reading config" and line["level"] == "INFO" and RFC3339_UTC.match(line["time"])
    assert line["detail"] == "/etc/tandem"  # not JSON by itself: its str
    assert set(line) == set(FIXED_KEYS) | {"detail"}


async def test_the_apps_log_calls_keep_their_fields(lines: io.StringIO, client: Client) -> None:
    await client.post("filter", {"Pod": None, "NodeNames": []})
    (line,) = [r for r in records(lines) if r["message"] == "request refused"]
    assert line["logger"] == "tandem.extender" and line["level"] == "WARNING"
    assert line["verb"] == "filter" and "Pod is missing" in line["error"] and isinstance(line["decision_id"], int)
    assert set(line) == set(FIXED_KEYS) | {"verb", "decision_id", "pod", "error"}
