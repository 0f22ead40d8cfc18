"""Party tables (xclp.data.tables): CSV and .npz as real tools export them, and every bad input refused
with the file, line, column and value, and what to do (docs/design.md §8, §9)."""

from __future__ import annotations

import numpy as np
import pytest

from xclp.data import tables as party_data
from xclp.errors import InvalidInput


def test_csv_with_ids_and_unlabeled_rows(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("pid,x1,x2,dx\nr1,1.5,2,1\nr2,0,-1,\n\nr3,3,4,0\n")
    d = party_data.load(path, label_column="dx", id_column="pid")
    assert d.ids == ("r1", "r2", "r3")
    np.testing.assert_array_equal(d.X, [[1.5, 2], [0, -1], [3, 4]])
    np.testing.assert_array_equal(d.y, [1, -1, 0])
    assert d.labeled.tolist() == [True, False, True]


@pytest.mark.parametrize("text, match", [
    ("x1,label\n1,1,3\n", "has 3 cells"),
    ("label\n1\n", "no feature columns"),
    ("", "empty"),
    ("x1,label\n1,-3\n", ">= 0"),
])
def test_bad_csv_files_name_line_and_problem(tmp_path, text, match):
    (tmp_path / "d.csv").write_text(text)
    with pytest.raises(InvalidInput, match=match):
        party_data.load(tmp_path / "d.csv")


def test_npz_data_and_its_errors(tmp_path):
    np.savez(tmp_path / "d.npz", X=np.ones((3, 2)), y=np.array([0.0, np.nan, 1.0]))
    d = party_data.load(tmp_path / "d.npz")
    assert d.y.tolist() == [0, -1, 1] and d.ids == ("0", "1", "2")
    np.savez(tmp_path / "e.npz", features=np.ones((3, 2)))
    with pytest.raises(InvalidInput, match="named X"):
        party_data.load(tmp_path / "e.npz")


# ---- what common tools write (issue: bad input that still gets through) --------------------------


def test_duplicate_row_ids_are_refused_naming_the_id_and_both_lines(tmp_path):
    (tmp_path / "d.csv").write_text("pid,x1,label\nr1,1,0\nr2,2,1\n\nr1,3,\n")
    with pytest.raises(InvalidInput, match=r"row id 'r1' appears twice \(line 2 and line 5\)"):
        party_data.load(tmp_path / "d.csv", id_column="pid")
    np.savez(tmp_path / "d.npz", X=np.ones((3, 2)), ids=np.array(["a", "b", "a"]))
    with pytest.raises(InvalidInput, match=r"row id 'a' appears twice \(row 0 and row 2\)"):
        party_data.load(tmp_path / "d.npz")


def test_duplicate_column_names_are_refused(tmp_path):
    (tmp_path / "d.csv").write_text("f1,f2,f1,label\n1,2,3,0\n")
    with pytest.raises(InvalidInput, match=r"names a column twice: 'f1' \(columns 1, 3\)"):
        party_data.load(tmp_path / "d.csv")


def test_pandas_float_labels_are_read_as_classes_and_fractions_refused(tmp_path):
    """pandas writes an integer column that has empty cells as floats: 1.0, empty, 0.0."""
    (tmp_path / "d.csv").write_text("x1,label\n1,1.0\n2,\n3,0.0\n4,2\n")
    assert party_data.load(tmp_path / "d.csv").y.tolist() == [1, -1, 0, 2]
    (tmp_path / "e.csv").write_text("x1,label\n1,1.0\n2,1.5\n")
    with pytest.raises(InvalidInput, match=r"line 3: label '1.5' is not an integer class"):
        party_data.load(tmp_path / "e.csv").with_classes(None)
    (tmp_path / "f.csv").write_text("x1,label\n1,inf\n")
    with pytest.raises(InvalidInput, match="label 'inf' is not an integer class"):
        party_data.load(tmp_path / "f.csv").with_classes(None)


def test_excel_utf8_byte_order_mark_is_not_part_of_the_first_column_name(tmp_path):
    (tmp_path / "d.csv").write_bytes("\ufeffpatient_id,x1,label\np1,1,0\np2,2,\n".encode("utf-8"))
    d = party_data.load(tmp_path / "d.csv", id_column="patient_id")
    assert d.ids == ("p1", "p2") and d.y.tolist() == [0, -1]


def test_semicolon_separated_files_are_detected_or_named(tmp_path):
    """European Excel writes ';' with decimal points left as they are."""
    (tmp_path / "d.csv").write_text("patient_id;x1;x2;label\np1;1.5;2;0\np2;0;-1;\n")
    d = party_data.load(tmp_path / "d.csv", id_column="patient_id")
    assert d.ids == ("p1", "p2") and d.X.tolist() == [[1.5, 2.0], [0.0, -1.0]]
    assert party_data.load(tmp_path / "d.csv", id_column="patient_id", delimiter=";").ids == ("p1", "p2")
    with pytest.raises(InvalidInput, match=r"looks ';'-separated; pass --delimiter ';'"):
        party_data.load(tmp_path / "d.csv", id_column="patient_id", delimiter=",")
    (tmp_path / "t.csv").write_text("patient_id\tx1\tlabel\np1\t1\t0\n")
    assert party_data.load(tmp_path / "t.csv", id_column="patient_id").ids == ("p1",)
    with pytest.raises(InvalidInput, match="--delimiter must be one of"):
        party_data.load(tmp_path / "t.csv", delimiter=":")


def test_the_cli_delimiter_flag_spells_tab_as_a_word(tmp_path):
    (tmp_path / "t.csv").write_text("id\tx1,x2\tlabel\na\t1.5\t0\n")  # a comma inside a tab-separated name
    with pytest.raises(InvalidInput, match=r"has 1 cells but the header has 2 \(the header looks '\\t'-separated; pass "
                                           r"--delimiter tab\)"):
        party_data.load(tmp_path / "t.csv", id_column="id", delimiter=",")
    for spelled in ("tab", "\\t", "\t"):  # as typed in a flag or a TOML file, or the character
        d = party_data.load(tmp_path / "t.csv", id_column="id", delimiter=spelled)
        assert d.ids == ("a",) and d.X.shape == (1, 1)


# ---- pyarrow reading, Parquet, missing cells, class names (docs/design.md §8) ---------------------------


def test_empty_and_na_feature_cells_read_as_missing_and_are_refused_naming_the_line_unless_imputed(tmp_path):
    (tmp_path / "d.csv").write_text("pid,x1,x2,label\nr1,1.5,2,0\nr2,,NA,1\n\n,,,\nr3,nan,4,\n")
    d = party_data.load(tmp_path / "d.csv", id_column="pid")
    assert d.ids == ("r1", "r2", "r3")  # the blank line and the row of empty cells are not data
    np.testing.assert_array_equal(np.isnan(d.X), [[False, False], [True, True], [True, False]])
    assert d.missing.tolist() == [2, 1]
    with pytest.raises(InvalidInput, match=r"d.csv line 3, column 'x1': the cell is empty or NaN \(3 such feature "
                                           r"cells "
                                           r"in all\); .*impute = \"mean\""):
        d.check_missing(impute=False)
    assert d.check_missing(impute=True).tolist() == [2, 1]


def test_a_bad_cell_after_the_first_batch_is_named_by_line_column_and_value(tmp_path, monkeypatch):
    monkeypatch.setattr(party_data, "BLOCK_BYTES", 64)  # many small batches: the error is in a later one
    lines = ["x1,x2,label"] + [f"{i},{i * 2},{i % 2}" for i in range(200)]
    lines[150] = "149,2e,1"
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidInput, match=r"d.csv line 151, column 'x2': '2e' is not a number"):
        party_data.load(tmp_path / "d.csv")
    lines[150] = "149,1"
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidInput, match=r"d.csv line 151 has 2 cells but the header has 3"):
        party_data.load(tmp_path / "d.csv")
    lines[150] = "149,298,1"
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    d = party_data.load(tmp_path / "d.csv")
    assert d.X.shape == (200, 2) and d.X[199].tolist() == [199.0, 398.0] and d.y[:4].tolist() == [0, 1, 0, 1]


def test_infinite_feature_values_are_refused_not_read_as_missing(tmp_path):
    (tmp_path / "d.csv").write_text("x1,label\n1,0\n1e400,1\n")
    with pytest.raises(InvalidInput, match="NaN/inf"):
        party_data.load(tmp_path / "d.csv")


def test_parquet_tables_read_like_csv_and_text_features_are_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"pid": ["a", "b", "c"], "age": pa.array([40, None, 61], pa.int32()),
                      "dose": [1.5, 2.0, float("nan")], "dx": ["benign", None, "malignant"]})
    pq.write_table(table, tmp_path / "d.parquet")
    d = party_data.load(tmp_path / "d.parquet", label_column="dx", id_column="pid")
    assert d.ids == ("a", "b", "c") and d.columns == ("age", "dose")
    np.testing.assert_array_equal(np.isnan(d.X), [[False, False], [True, False], [False, True]])
    assert d.y is None and d.labeled.tolist() == [True, False, True]
    assert d.with_classes(["malignant", "benign"]).y.tolist() == [1, -1, 0]
    with pytest.raises(InvalidInput, match=r"d.parquet row 2, column 'age': the cell is empty"):
        d.check_missing(impute=False)
    pq.write_table(table.append_column("site", pa.array(["x", "y", "z"])), tmp_path / "e.parquet")
    with pytest.raises(InvalidInput, match="column 'site' holds string, not numbers"):
        party_data.load(tmp_path / "e.parquet", label_column="dx", id_column="pid")
    (tmp_path / "f.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(InvalidInput, match="cannot read .*f.parquet as Parquet"):
        party_data.load(tmp_path / "f.parquet")


def test_class_names_map_by_the_declared_order_and_undeclared_names_list_the_declared(tmp_path):
    (tmp_path / "d.csv").write_text("x1,diagnosis\n1, benign\n2,malignant\n3,\n4,benign\n")
    d = party_data.load(tmp_path / "d.csv", label_column="diagnosis")
    assert d.labeled.tolist() == [True, True, False, True]
    assert d.with_classes(["benign", "malignant"]).y.tolist() == [0, 1, -1, 0]
    assert d.with_classes(["malignant", "benign"]).y.tolist() == [1, 0, -1, 1]
    with pytest.raises(InvalidInput, match=r"line 3: label 'malignant' is not one of the job's classes: 'benign', "
                                           r"'Malignant'"):
        d.with_classes(["benign", "Malignant"])
    with pytest.raises(InvalidInput, match=r"line 2: label 'benign' is not an integer class >= 0; declare the class "
                                           r"names in the job file"):
        d.with_classes(None)


def test_npz_with_column_names_and_string_labels(tmp_path):
    np.savez(tmp_path / "d.npz", X=np.array([[1.0, np.nan], [2.0, 3.0]]), y=np.array(["b", ""]),
             columns=np.array(["f1", "f2"]))
    d = party_data.load(tmp_path / "d.npz")
    assert d.columns == ("f1", "f2") and d.with_classes(["a", "b"]).y.tolist() == [1, -1]
    assert d.missing.tolist() == [0, 1] and len(d.schema_digest) == 32


def test_the_schema_digest_follows_names_and_order():
    X = np.zeros((1, 2))
    a = party_data.PartyData(X, None, ("0",), ("age", "dose"))
    assert a.schema_digest == party_data.PartyData(X, None, ("0",), ("age", "dose")).schema_digest
    assert a.schema_digest != party_data.PartyData(X, None, ("0",), ("dose", "age")).schema_digest
    assert party_data.PartyData(X, None, ("0",)).schema_digest == b""


def test_line_numbers_count_rows_of_only_na_cells_as_skipped_like_the_reader(tmp_path):
    (tmp_path / "d.csv").write_text("pid,x1,label\nr1,1,0\nNA,NA,NA\nr2,x,1\n")
    with pytest.raises(InvalidInput, match=r"line 4, column 'x1': 'x' is not a number"):
        party_data.load(tmp_path / "d.csv", id_column="pid")
    (tmp_path / "e.csv").write_text("pid,x1,label\nr1,1,0\nNA,NA,NA\nr2,,1\n")
    d = party_data.load(tmp_path / "e.csv", id_column="pid")
    assert d.ids == ("r1", "r2")
    with pytest.raises(InvalidInput, match=r"e.csv line 4, column 'x1'"):
        d.check_missing(impute=False)


def test_categorical_columns_become_one_hot_columns_in_the_declared_order(tmp_path):
    (tmp_path / "d.csv").write_text("pid,age,site,label\nr1,40,north,0\nr2,51, south ,1\nr3,62,,\n")
    d = party_data.load(tmp_path / "d.csv", id_column="pid", categorical={"site": ["south", "east", "north"]})
    assert d.columns == ("age", "site=south", "site=east", "site=north")
    np.testing.assert_array_equal(d.X[:2], [[40, 0, 0, 1], [51, 1, 0, 0]])
    assert np.isnan(d.X[2, 1:]).all() and d.X[2, 0] == 62  # an empty cell is missing in every one-hot column
    with pytest.raises(InvalidInput, match=r"d.csv line 3, column 'site': 'south' is not one of the job's "
                                           r"categories for it: 'north', 'east'"):
        party_data.load(tmp_path / "d.csv", id_column="pid", categorical={"site": ["north", "east"]})
    with pytest.raises(InvalidInput, match="has no column 'region', which the job declares categorical"):
        party_data.load(tmp_path / "d.csv", id_column="pid", categorical={"region": ["a"]})
    with pytest.raises(InvalidInput, match=r"line 2, column 'site': 'north' is not a number"):
        party_data.load(tmp_path / "d.csv", id_column="pid")  # text without a declaration
    np.savez(tmp_path / "d.npz", X=np.ones((2, 2)))
    with pytest.raises(InvalidInput, match="a .npz matrix cannot hold"):
        party_data.load(tmp_path / "d.npz", categorical={"site": ["a"]})


def test_categorical_parquet_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"age": [1.0, 2.0], "site": ["b", "a"], "label": [0, 1]}), tmp_path / "d.parquet")
    d = party_data.load(tmp_path / "d.parquet", categorical={"site": ["a", "b"]})
    assert d.columns == ("age", "site=a", "site=b") and d.X.tolist() == [[1, 0, 1], [2, 1, 0]]
    assert d.y.tolist() == [0, 1]
