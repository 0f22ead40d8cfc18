"""Which data set a table is (xclp/data/identity.py): the table as read, whatever the job does to it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from xclp.data import tables
from xclp.data.identity import LABEL, data_set_digest, table_digest
from xclp.data.party_table import Labels, PartyData

ROWS = [("r1", "1.5", "red", "0"), ("r2", "2", "blue", "1"), ("r3", "", "red", ""), ("r4", "-0", "blue", "2")]


def write(path, rows, header=("id", "x", "colour", "label"), order=(0, 1, 2, 3)):
    lines = [",".join(header[i] for i in order)] + [",".join(row[i] for i in order) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def read(path, categories=("red", "blue")):
    return tables.load(path, id_column="id", categorical={"colour": list(categories)})


def test_a_re_export_in_another_row_and_column_order_and_number_format_is_the_same_data_set(tmp_path) -> None:
    first = read(write(tmp_path / "a.csv", ROWS))
    shuffled = [ROWS[2], ROWS[0], ROWS[3], ROWS[1]]
    formatted = [(i, {"1.5": "1.50", "2": "2.0", "-0": "0"}.get(x, x), c, {"0": "0.0"}.get(y, y))
                 for i, x, c, y in shuffled]
    again = read(write(tmp_path / "b.csv", formatted, order=(3, 2, 0, 1)))
    assert first.dataset_digest is not None and first.dataset_digest == again.dataset_digest


def test_the_jobs_categorical_order_and_classes_do_not_change_the_data_set(tmp_path) -> None:
    path = write(tmp_path / "a.csv", ROWS)
    one, other = read(path, ("red", "blue")), read(path, ("blue", "red"))
    assert not np.array_equal(one.X, other.X, equal_nan=True)  # the job's encodings differ
    assert one.dataset_digest == other.dataset_digest
    named = PartyData(np.zeros((3, 1)), None, ("a", "b", "c"), labels=Labels(np.array([0, 1, -1], np.int32),
                                                                             ("no", "yes")))
    assert data_set_digest(named.with_classes(["no", "yes"])) == data_set_digest(named.with_classes(["yes", "no"]))


def test_any_changed_cell_row_or_label_is_another_data_set(tmp_path) -> None:
    base = read(write(tmp_path / "a.csv", ROWS)).dataset_digest
    for k, changed in enumerate((
            [("r1", "1.6", "red", "0"), *ROWS[1:]],  # a value
            [("r1", "1.5", "blue", "0"), *ROWS[1:]],  # a category
            [("r1", "1.5", "red", "1"), *ROWS[1:]],  # a label
            [("r1", "1.5", "red", ""), *ROWS[1:]],  # a label removed
            ROWS[:3],  # a row removed
            [("r9", "1.5", "red", "0"), *ROWS[1:]])):  # an id
        assert read(write(tmp_path / f"c{k}.csv", changed)).dataset_digest != base, k


def test_a_file_and_the_same_table_in_memory_are_one_data_set(tmp_path) -> None:
    path = write(tmp_path / "a.csv", [(i, x, y) for i, x, _, y in ROWS], header=("id", "x", "label"), order=(0, 1, 2))
    from_file = tables.load(path, id_column="id")
    table = pa.table({"id": ["r1", "r2", "r3", "r4"], "x": [1.5, 2.0, None, -0.0], "label": [0, 1, None, 2]})
    in_memory = tables.from_arrow(table, id_column="id")
    built = PartyData(from_file.X, from_file.y, from_file.ids, from_file.columns)  # numbers, no names
    assert data_set_digest(from_file) == data_set_digest(in_memory) == data_set_digest(built)


@settings(max_examples=40, deadline=None)
@given(st.permutations(range(6)), st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=6, max_size=6))
def test_the_name_does_not_depend_on_the_row_order(order, values) -> None:
    ids = [f"row{i}" for i in range(6)]
    x = np.array(values)
    labels = ["a", None, "b", "a", "c", None]
    one = table_digest({"x": x, LABEL: labels}, ids)
    other = table_digest({"x": x[list(order)], LABEL: [labels[i] for i in order]}, [ids[i] for i in order])
    assert one == other
