"""The tables `mclpipe run` prints for a text pipeline (contrastive.modalities.text.modality.TextModality.tables)."""
from pipeline_config.loader import load_config


def test_text_tables_have_the_image_shape_and_a_conditioned_table():
    from contrastive.modalities.text.modality import MODALITY
    from flows.cli import rich_table

    config = load_config("text_tiny")
    stage = {"probe/place": 0.5, "knn/place": 0.25, "sts/spearman": 0.125}
    summary = {"results": {"stage 0": stage, "MCL concat": stage},
               "final": {"csts/hyper_spearman": 0.75, "csts/hyper_pair_accuracy": 1.0,
                         "csts/test_quadruples": 4.0, "recall/place_hyper": 0.5,
                         "recall/place_unconditioned": 0.25}}
    tables = [rich_table(t) for t in MODALITY.tables(config, summary)]
    assert [t.title.split(",")[0] for t in tables] == [
        "text_tiny: linear-probe accuracy (held-out sentences)", "kNN accuracy", "STS Spearman (cosine vs gold)",
        "C-STS", "conditioned retrieval recall@5"]
    assert [c.header for c in tables[0].columns] == ["representation", "place"]
    assert tables[0].row_count == 2
    assert [c.header for c in tables[3].columns] == ["representation", "Spearman", "pair accuracy"]
    assert list(tables[3].columns[1].cells) == ["0.750", "nan", "nan"]  # Hyper-CL, linear, unconditioned
    assert list(tables[4].columns[1].cells) == ["0.500", "nan", "0.250"]


def test_deployments_serve_the_one_pipeline_flow():
    from flows.deployments import ENTRYPOINT
    from flows.pipeline import mcl_pipeline

    assert ENTRYPOINT == "flows/pipeline.py:mcl_pipeline"
    deployment = mcl_pipeline.to_deployment(name="t", parameters={"config": load_config("text_tiny").model_dump(
        mode="json")})
    assert deployment.parameters["config"]["pipeline"] == "text"
