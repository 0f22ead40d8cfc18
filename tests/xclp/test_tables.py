"""Party tables (xclp.tables): CSV and .npz as real tools export them, and every bad input refused
with the file, line, column and value, and what to do (DESIGN §8, §9)."""

from __future__ import annotations

import numpy as np
import pytest

from xclp import tables as party_data
from xclp.client import cli
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
    with pytest.raises(InvalidInput, match=r"has 1 cells but the header has 2 \(the header looks '\\t'-separated; pass --delimiter tab\)"):
        party_data.load(tmp_path / "t.csv", id_column="id", delimiter=",")
    d = party_data.load(tmp_path / "t.csv", id_column="id", delimiter=cli._delimiter("tab"))
    assert d.ids == ("a",) and d.X.shape == (1, 1)
