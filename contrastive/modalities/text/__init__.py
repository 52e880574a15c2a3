"""The text modality's library: sentence data (files and a template generator), tokenizers, sentence encoders
(a small transformer from scratch, or a local Hugging Face checkpoint such as MiniLM-L6), SimCSE losses, the
isotropy diagnostics of "On Isotropy and Learning Dynamics of Contrastive-based Sentence Representation
Learning", STS evaluation and Hyper-CL's conditioned projections. No Prefect or MLflow here."""
