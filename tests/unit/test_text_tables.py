"""The admin commands' plain-text tables."""

from __future__ import annotations

from kittiwake.text_tables import format_table


def test_columns_fit_the_widest_cell_and_numbers_align_right() -> None:
    text = format_table(
        ["NAME", "DEPTH", "DURABLE"],
        [("orders", 5, True), ("a-much-longer-name", 12345, False), ("none", None, None)],
    )
    assert text.splitlines() == [
        "NAME                DEPTH  DURABLE",
        "------------------  -----  -------",
        "orders                  5  yes",
        "a-much-longer-name  12345  no",
        "none                    -  -",
    ]


def test_an_empty_table_says_so() -> None:
    assert format_table(["A", "B"], []).splitlines() == ["A  B", "-  -", "(none)"]
