"""Command-line values the qualify tools share: comma-separated integer lists, checked by name."""

from __future__ import annotations


def int_list(parser, flag: str, text: str, *, least: int = 1, empty: bool = False) -> tuple[int, ...]:
    """``text`` (comma-separated integers, blanks ignored) as a tuple, or ``parser.error`` naming ``flag``: an item
    that is not an integer, one below ``least``, or no item at all unless ``empty``."""
    try:
        values = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        parser.error(f"{flag} {text!r}: expected comma-separated integers, e.g. 1,4")
    if not values and not empty:
        parser.error(f"{flag} {text!r}: expected at least one value")
    low = [v for v in values if v < least]
    if low:
        parser.error(f"{flag} {text!r}: {low} below {least}")
    return values
