"""Plain-text tables for the admin commands: columns sized to their widest cell, numbers
right-aligned. Pure formatting; knows nothing of the broker."""

from __future__ import annotations

from collections.abc import Sequence


def cell_text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """The table as lines (header, a rule, one line per row); "(none)" under the header when
    there are no rows. Trailing spaces are trimmed."""
    texts = [[cell_text(value) for value in row] for row in rows]
    numeric = [
        bool(rows)
        and all(
            isinstance(row[i], (int, float)) and not isinstance(row[i], bool)
            for row in rows
            if row[i] is not None
        )
        for i in range(len(headers))
    ]
    widths = [
        max([len(header)] + [len(row[i]) for row in texts]) for i, header in enumerate(headers)
    ]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(cells, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    lines = [line(list(headers)), line(["-" * width for width in widths])]
    lines += [line(row) for row in texts]
    if not rows:
        lines.append("(none)")
    return "\n".join(lines)
