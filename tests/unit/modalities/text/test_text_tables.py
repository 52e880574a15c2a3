"""The tables `mclpipe run` prints for a text pipeline (flows.text_flow.text_tables)."""
from pipeline_config.loader import load_config


def test_text_tables_have_the_image_shape_and_a_conditioned_table():
    from flows.cli import results_table
    from flows.text_flow import text_tables

    config = load_config("text_tiny")
    stage = {"probe/place": 0.5, "knn/place": 0.25, "sts/spearman": 0.125}
    summary = {"results": {"stage 0": stage, "MCL concat": stage},
               "conditioned": {"csts/hyper_spearman": 0.75, "csts/hyper_pair_accuracy": 1.0,
                               "csts/test_quadruples": 4.0, "recall/place_hyper": 0.5,
                               "recall/place_unconditioned": 0.25}}
    tables = text_tables(config, summary, results_table=results_table)
    assert [t.title.split(",")[0] for t in tables] == [
        "text_tiny: linear-probe accuracy (held-out sentences)", "kNN accuracy", "STS Spearman (cosine vs gold)",
        "C-STS", "conditioned retrieval recall@5"]
    assert [c.header for c in tables[0].columns] == ["representation", "place"]
    assert tables[0].row_count == 2
    assert list(tables[3].columns[1].cells) == ["0.750", "nan", "nan"]  # Hyper-CL, linear, unconditioned
    assert list(tables[4].columns[1].cells) == ["0.500", "nan", "0.250"]


def test_deployments_serve_the_text_flow():
    from flows.deployments import ENTRYPOINTS, flow_for
    from flows.text_flow import text_pipeline

    assert flow_for(load_config("text_tiny")) is text_pipeline
    assert ENTRYPOINTS["text"] == "flows/text_flow.py:text_pipeline"
