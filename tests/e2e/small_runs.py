"""Each modality's tiny preset made smaller still, for the tests that run several whole pipelines (the load test's
eight, the release test's one per modality): what they check (a pipeline completes, shares or reuses its steps,
installs and runs from a wheel) holds at any size, and CI's time is theirs times the number they run. Two MCL stages,
no control run (trifeature's and text's would add two trainings each), fewer samples and steps."""

#: preset -> the overrides that make it smaller (as in tests/flows/test_modalities.py)
SMALLER = {
    "trifeature_tiny": ["mcl.num_stages=2", "mcl.control=false", "data.trifeature.num_train=128",
                        "data.trifeature.num_test=64", "train.batch_size=16"],
    "clip_tiny": ["train.max_steps_per_epoch=3", "data.synthetic.num_train=288", "eval.soup=false"],
    "text_tiny": ["mcl.control=false"],
    "embeddings_tiny": ["mcl.control=false", "train.epochs=2"],
}
