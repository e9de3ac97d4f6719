"""The times of the protocol's JSON answers: RFC 3339 in UTC (PROTOCOL.md §1)."""

from __future__ import annotations

import datetime as _dt
import re
from typing import Optional


def parse_api_time(s: str) -> _dt.datetime:
    """An RFC 3339 UTC time of a JSON answer (`Z`; digits past microseconds are dropped)."""
    m = re.fullmatch(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?Z", s or "")
    if not m:
        raise ValueError("bad time %r" % s)
    frac = (m.group(2) or "")[:6].ljust(6, "0")
    return _dt.datetime.strptime(m.group(1) + "." + frac, "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=_dt.timezone.utc)


def unix_seconds(s: str) -> Optional[float]:
    """The Unix time in seconds of an answer's RFC 3339 time, or None when it is not one."""
    try:
        return parse_api_time(s).timestamp()
    except (TypeError, ValueError):
        return None
