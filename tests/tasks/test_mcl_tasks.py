"""Pure helpers of tasks/mcl_tasks.py (no Prefect run needed)."""
from pipeline_config.schema import ClipPipelineConfig, PipelineConfig
from tasks.mcl_tasks import stage_seed


def test_stage_seeds_are_distinct_across_pipeline_seeds_and_stages():
    # seed + stage made stage 1 of seed 0 the same model as stage 0 of seed 1 (a control stage has no
    # pseudo-labels), so a 3-seed study silently shared models between seeds.
    seeds = {(seed, stage): stage_seed(PipelineConfig(seed=seed), stage) for seed in range(10) for stage in range(100)}
    assert len(set(seeds.values())) == len(seeds)
    assert stage_seed(ClipPipelineConfig(seed=2), 1) == stage_seed(PipelineConfig(seed=2), 1)
