"""The span limits of the SDK specification (sdk-environment-variables.md, "Span Limits"), read from the environment.

Each is a whole number of 0 or more; unset, the specification's defaults (no value length limit, 128 attributes,
128 events, 128 attributes per event) are above what any span here holds, so nothing is cut. A value that is no
such number is warned about and ignored (the span-specific variable then falls back to the general one).
Applied by the span encoder: value lengths as attributes are made (span_attributes.limit_lengths), counts on the
encoded spans (span_caps.py), attributes per event as the injected probes' events are written (probe_events.py).
"""

from collections.abc import Mapping
from typing import NamedTuple

from retsnoop_otel.export.otel_env import (
    ATTRIBUTE_COUNT_LIMIT,
    ATTRIBUTE_VALUE_LENGTH_LIMIT,
    EVENT_ATTRIBUTE_COUNT_LIMIT,
    SPAN_ATTRIBUTE_COUNT_LIMIT,
    SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT,
    SPAN_EVENT_COUNT_LIMIT,
    EnvWarnings,
    value,
    warnings_or_new,
)

VALUE_LENGTH_VARS = (SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT, ATTRIBUTE_VALUE_LENGTH_LIMIT)  # the first usable one wins
COUNT_VARS = (SPAN_ATTRIBUTE_COUNT_LIMIT, ATTRIBUTE_COUNT_LIMIT)
EVENT_COUNT_VARS = (SPAN_EVENT_COUNT_LIMIT,)
EVENT_ATTRIBUTE_VARS = (EVENT_ATTRIBUTE_COUNT_LIMIT, ATTRIBUTE_COUNT_LIMIT)  # the general count limit applies too


class SpanLimits(NamedTuple):
    value_length: int | None = None  # longest string attribute value
    attributes: int | None = None  # attributes per span (dropped_attributes_count)
    events: int | None = None  # events per span (dropped_events_count)
    event_attributes: int | None = None  # attributes per event (the event's dropped_attributes_count)


def _limit(environ: Mapping[str, str], names: tuple[str, ...], fix: str, warnings: EnvWarnings | None) -> int | None:
    """The first of `names` that holds a whole number of 0 or more; one that holds something else is warned
    about and skipped (an empty variable counts as unset)."""
    for var in names:
        text = value(environ, var)
        if not text:
            continue
        if not text.isdigit() or len(text) > 10:
            warnings_or_new(warnings).ignore(var, fix, text)
            continue
        return int(text)
    return None


def attribute_value_limit(environ: Mapping[str, str], warnings: EnvWarnings | None = None) -> int | None:
    """The longest string an attribute value may hold (None: no limit, the specification's default)."""
    return _limit(environ, VALUE_LENGTH_VARS, "not a length; write a number of characters such as 4096 (0 or more), "
                  "or unset it for no limit", warnings)


def _count(environ: Mapping[str, str], names: tuple[str, ...], what: str, warnings: EnvWarnings | None) -> int | None:
    return _limit(environ, names, f"not a count; write a number of {what} such as 128 (0 or more), or unset it for "
                  "the default of 128", warnings)


def attribute_count_limit(environ: Mapping[str, str], warnings: EnvWarnings | None = None) -> int | None:
    """The most attributes a span may hold (None: unset, the specification's 128, above what any span here has)."""
    return _count(environ, COUNT_VARS, "attributes", warnings)


def span_limits(environ: Mapping[str, str], warnings: EnvWarnings | None = None) -> SpanLimits:
    return SpanLimits(attribute_value_limit(environ, warnings), attribute_count_limit(environ, warnings),
                      _count(environ, EVENT_COUNT_VARS, "events", warnings),
                      _count(environ, EVENT_ATTRIBUTE_VARS, "attributes", warnings))
