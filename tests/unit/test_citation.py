"""CITATION.cff: valid against the Citation File Format 1.2.0 schema (tests/unit/cff-schema-1.2.0.json, the schema
cffconvert 2.0.0 ships; ``cffconvert --validate`` agrees), the version pyproject.toml holds, and a reference for
every method and data set mclpipe implements, each with a working identifier."""
import json
import re
import tomllib
import typing
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SCHEMA = Path(__file__).with_name("cff-schema-1.2.0.json")
ARXIV = re.compile(r"^arXiv:\d{4}\.\d{4,5}$")
DOI = re.compile(r"^10\.\d{4,9}/\S+$")


def citation() -> dict:
    return yaml.safe_load((REPO / "CITATION.cff").read_text())


def test_citation_file_is_valid_cff_1_2_0():
    import jsonschema
    errors = sorted(jsonschema.Draft7Validator(json.loads(SCHEMA.read_text())).iter_errors(citation()),
                    key=lambda e: e.json_path)
    assert not errors, "\n".join(f"{e.json_path}: {e.message[:300]}" for e in errors)


def test_citation_version_is_the_release():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert str(citation()["version"]) == project["version"]


def test_every_reference_has_authors_a_year_and_an_identifier_that_matches_its_link():
    references = citation()["references"]
    assert len(references) >= 15
    for ref in references:
        assert ref["authors"] and ref["year"] and ref["url"].startswith("https://"), ref["title"]
        for ident in ref.get("identifiers", []):
            assert ARXIV.match(ident["value"]), (ref["title"], ident)
            if "arxiv.org" in ref["url"]:
                assert ref["url"] == f"https://arxiv.org/abs/{ident['value'].removeprefix('arXiv:')}", ref["title"]
        if "doi" in ref:
            assert DOI.match(ref["doi"]), (ref["title"], ref["doi"])
    titles = [ref["title"] for ref in references]
    assert len(set(titles)) == len(titles)


def test_every_method_and_data_set_mclpipe_implements_is_cited():
    """Each ``method.name`` of the image and text pipelines and each bundled ``data.kind`` (the user's own
    folders and shards aside) is named in a reference's notes, so adding a method without its paper fails here."""
    from contrastive.modalities.image.config import DataConfig, MethodConfig
    from contrastive.modalities.text.steps import METHODS as TEXT_METHODS
    notes = " ".join(ref.get("notes", "") for ref in citation()["references"])
    named = set(re.findall(r"(method\.name|data\.kind)=(\w+)", notes))
    methods = set(typing.get_args(MethodConfig.model_fields["name"].annotation)) | set(TEXT_METHODS)
    kinds = set(typing.get_args(DataConfig.model_fields["kind"].annotation)) - {"image_folder", "shards"}
    assert {("method.name", m) for m in methods} <= named, sorted(methods - {v for k, v in named})
    assert {("data.kind", k) for k in kinds} <= named, sorted(kinds - {v for k, v in named})
    for paper in ("Learning the Unlearned", "HEX:", "SimCSE", "Learning Transferable Visual Models", "OpenCLIP",
                  "Model soups", "Eyes Wide Shut", "Hyper-CL", "On Isotropy", "A Framework For Contrastive",
                  "Conceptual 12M"):
        assert paper in notes + " ".join(ref["title"] for ref in citation()["references"]), paper
