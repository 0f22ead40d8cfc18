"""The job parameter tables (docs/job-parameters.md) are the schemas' own text (a new user never has to guess a
name, a default or a range)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from xclp.v1 import registry
from xclp.v1.registry import parameter_reference

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "job-parameters.md"


def test_readme_job_parameters_are_generated_from_the_schemas() -> None:
    text = REFERENCE.read_text()
    begin, end = "<!-- job-parameters:begin -->\n", "<!-- job-parameters:end -->"
    assert begin in text and end in text
    section = text.split(begin, 1)[1].split(end, 1)[0]
    assert section == parameter_reference(), "run scripts/gen-job-reference and commit docs/job-parameters.md"


def test_every_parameter_of_every_job_type_is_documented() -> None:
    reference = parameter_reference()
    for job_type in registry.names():
        schema = registry.get(job_type).params
        assert f'`type = "{job_type}"`' in reference
        for f in fields(schema):
            assert f.metadata["meaning"] and f.metadata["range"], f"{job_type}.{f.name} has no text"
            assert f"| `{f.name}` |" in reference
    # the RACE names a new user had to guess
    for name in ("rows", "width", "family", "p", "bandwidth"):
        assert f"| `{name}` |" in reference
