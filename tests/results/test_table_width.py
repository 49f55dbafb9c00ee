"""Tables fit the terminal (100 columns without one): wide ones print in parts that repeat the label columns, a
long cell folds, and the header rule is exactly as wide as the table."""

from stepscope.results.views import format_value, render


def _tables(text: str) -> list[list[str]]:
    """Each table's lines: its header, its rule, its rows (up to the next blank line)."""
    lines = text.splitlines()
    tables = []
    for i, line in enumerate(lines):
        if line.strip() and set(line.strip()) == {"─"}:
            end = next((j for j in range(i + 1, len(lines)) if not lines[j].strip()), len(lines))
            tables.append(lines[i - 1:end])
    return tables


def _check(text: str, limit: int) -> list[list[str]]:
    """Every line within `limit`, and each table's rule exactly as wide as the table."""
    assert max(len(line) for line in text.splitlines()) <= limit
    tables = _tables(text)
    for table in tables:
        header, rule, *rows = table
        assert len(rule) == max(len(line) for line in (header, *rows))
    return tables


def test_a_wide_table_prints_in_parts_that_repeat_the_labels():
    # the labels: the fewest leading columns that tell the rows apart (model alone would not)
    rows = [{"model": "llama3-8b", "op": op, **{f"metric_{i:02d}_TFLOPps": 1000.5 * i + j for i in range(12)}}
            for j, op in enumerate(("qkv", "attn_out"))]
    text = render(rows, title="rates", width=100)
    tables = _check(text, 100)
    assert len(tables) >= 2 and all(table[0].split()[:2] == ["model", "op"] for table in tables)  # the labels
    headers = [name for table in tables for name in table[0].split()[2:]]
    assert headers == [f"metric_{i:02d}_TFLOPps" for i in range(12)]  # every column once, in order
    for j, row in enumerate(rows):  # and every value, in its row of each part
        cells = [cell for table in tables for cell in table[2 + j].split()[2:]]
        assert cells == [format_value(row[name]) for name in headers]
    assert text.splitlines()[0] == "rates" and "(continued)" in text


def test_a_table_that_fits_is_one_part_and_its_rule_spans_it():
    rows = [{"phase": "forward", "median_ms": 12.25, "TFLOPps": 0.0512}, {"phase": "step", "median_ms": 40.5,
                                                                           "TFLOPps": 0.0498}]
    text = render(rows, title="step", width=100)
    assert "continued" not in text
    (table,) = _check(text, 100)
    assert table[0].split() == ["phase", "median_ms", "TFLOPps"] and len(table) == 4


def test_a_long_cell_folds_within_the_width():
    text = render([{"kernel": "void at::native::" + "x" * 180, "time_ms": 1.5}], width=100)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "".join(line.split()[0] if line.split() else "" for line in text.splitlines()[2:]).count("x") >= 180 - 60


def test_a_narrow_terminal_is_honoured():
    rows = [{"name": f"row{i}", **{f"c{j}": j * 1.5 for j in range(20)}} for i in range(3)]
    assert len(_check(render(rows, width=60), 60)) >= 3
