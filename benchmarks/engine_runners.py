"""The engines and workloads that `bench_engine.py` measures side by side: our scheduler
(paged, contiguous, with and without group sharing), HF `generate`, HF `generate_batch`
(continuous batching, pinned block count) and naive full recompute, over seeded workloads."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig
from transformers.generation.streamers import BaseStreamer

from benchmarks.bench_models import Models
from core_engine.scheduler import EngineConfig, InferenceScheduler
from core_engine.task import GenerationResult, SamplingParams
from core_engine.weights import canonical_weights

PAGE_SIZE = 32
FIRST_TOKEN_ID = 3  # prompts avoid the tiny config's pad/bos/eos ids


# ----------------------------------------------------------------------------- workloads
@dataclass(frozen=True)
class Workload:
    """`num_prompts x group` requests; prompt = shared prefix + distinct random tokens."""

    kind: str  # uniform | rl | prefix | coldprefix | long | step
    num_prompts: int
    prompt_len: int
    max_new: int
    group: int = 1
    min_new: int | None = None  # rl: lengths drawn from U[min_new, max_new]
    shared_prefix: int = 0
    greedy: bool = True
    engines: tuple[str, ...] = ("ours", "hf-generate")
    strategies: tuple[str, ...] = ("paged", "contiguous")  # ours: KV strategies to run
    repeats: int | None = None  # default: the model's

    @property
    def num_requests(self) -> int:
        return self.num_prompts * self.group

    @property
    def label(self) -> str:
        shape = f"{self.num_prompts}x{self.group}" if self.group > 1 else f"B={self.num_prompts}"
        new = f"{self.min_new}-{self.max_new}" if self.min_new else str(self.max_new)
        prefix = f" (shared {self.shared_prefix})" if self.shared_prefix else ""
        return f"{self.kind} {shape} P={self.prompt_len}{prefix} N={new}"

    def warmup(self) -> Workload:
        """One short prompt (its group kept): first calls, allocator, CB manager creation; with
        the shared prefix, so that timed runs find it cached."""
        prompt_len = self.shared_prefix + min(self.prompt_len - self.shared_prefix, 16)
        return replace(self, num_prompts=1, prompt_len=prompt_len, max_new=2, min_new=None)


@dataclass(frozen=True)
class Job:
    """One seeded instance of a workload: the prompts and every request's output length."""

    prompts: list[list[int]]
    group: int
    lengths: list[int]  # per request, prompt-major (the group's samples of prompt 0 first)
    greedy: bool

    @property
    def expanded_prompts(self) -> list[list[int]]:
        return [p for p in self.prompts for _ in range(self.group)]

    @property
    def output_tokens(self) -> int:
        return sum(self.lengths)


def make_job(workload: Workload, vocab_size: int, seed: str) -> Job:
    """Fresh prompts per `seed`; the shared prefix and the output lengths depend only on the
    workload, so every repeat produces the same number of tokens."""
    rng = random.Random(seed)
    prefix_rng = random.Random(f"prefix-{workload.kind}")
    lengths_rng = random.Random(f"lengths-{workload.label}")
    prefix = [
        prefix_rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(workload.shared_prefix)
    ]
    suffix_len = workload.prompt_len - workload.shared_prefix
    prompts = [
        prefix + [rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(suffix_len)]
        for _ in range(workload.num_prompts)
    ]
    if workload.min_new is None:
        lengths = [workload.max_new] * workload.num_requests
    else:
        lengths = [
            lengths_rng.randint(workload.min_new, workload.max_new)
            for _ in range(workload.num_requests)
        ]
    return Job(prompts, workload.group, lengths, workload.greedy)


# ----------------------------------------------------------------------------- engines
@dataclass
class Run:
    wall_s: float
    prefill_s: float | None  # until every request has its first token
    tokens: list[list[int]]  # per request, trimmed to its length
    cached_prompt_tokens: int = 0


Runner = Callable[[Job], Run]


def _sampling(job: Job, length: int, index: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=length,
        temperature=0.0 if job.greedy else 1.0,
        top_p=1.0,
        top_k=0,
        seed=index,
        ignore_eos=True,
    )


def ours_runner(
    models: Models,
    workload: Workload,
    strategy: str,
    logprobs: bool,
    share: bool = False,
    fresh: bool = False,
    update: bool = False,
) -> Runner:
    """Our scheduler with a pool sized for the workload. `share`: `samples_per_prompt=G`;
    `fresh`: a new engine (empty prefix cache) for every run, built before the clock starts;
    `update`: a weight update (same weights, next version) before every run, outside the
    clock, so that every batch is cold as in on-policy RL."""
    num_pages = workload.num_requests * -(-(workload.prompt_len + workload.max_new) // PAGE_SIZE)
    config = EngineConfig(
        max_batch_size=workload.num_requests,
        max_seq_len=num_pages // workload.num_requests * PAGE_SIZE,
        kv_strategy=strategy,
        page_size=PAGE_SIZE,
        num_pages=num_pages,
        max_prefill_tokens=max(1024, workload.num_requests * workload.prompt_len),
    )
    engine = InferenceScheduler(models.ours, config)

    def run(job: Job) -> Run:
        nonlocal engine
        if fresh:
            engine = InferenceScheduler(models.ours, config)
        if update:
            engine.update_weights(canonical_weights(models.ours), engine.version + 1)
        start = time.perf_counter()
        results = (
            _run_grouped(engine, job, logprobs) if share else _run_expanded(engine, job, logprobs)
        )
        wall = time.perf_counter() - start
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        return Run(
            wall_s=wall,
            prefill_s=max(r.time_to_first_token_s or 0.0 for r in results),
            tokens=[r.output_ids for r in results],
            cached_prompt_tokens=sum(r.num_cached_prompt_tokens for r in results),
        )

    return run


def _run_expanded(engine: InferenceScheduler, job: Job, logprobs: bool) -> list[GenerationResult]:
    params = [_sampling(job, n, i) for i, n in enumerate(job.lengths)]
    return engine.run_batch(job.expanded_prompts, params, return_logprobs=logprobs)


def _run_grouped(engine: InferenceScheduler, job: Job, logprobs: bool) -> list[GenerationResult]:
    """`samples_per_prompt=G` with per-sample lengths: `run_batch` takes one `SamplingParams`
    per prompt, so the tasks are made, given their own `max_tokens`, then stepped."""
    params = [_sampling(job, max(job.lengths), i * job.group) for i in range(len(job.prompts))]
    tasks = engine.make_tasks(job.prompts, params, job.group, return_logprobs=logprobs)
    for task, length in zip(tasks, job.lengths, strict=True):
        task.params = replace(task.params, max_tokens=length)
    engine.enqueue(tasks)
    while not all(t.finished for t in tasks):
        engine.step()
    return [GenerationResult.from_task(t) for t in tasks]


class _TokenClock(BaseStreamer):
    """Times `generate`'s streamer calls: the prompt, then one call per generated token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def hf_generate_runner(models: Models, workload: Workload) -> Runner:
    """HF `generate` with DynamicCache; every row runs to the longest request's length."""

    def run(job: Job) -> Run:
        max_new = max(job.lengths)
        sampling = {} if job.greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            do_sample=not job.greedy,
            num_return_sequences=job.group,
            eos_token_id=None,
            pad_token_id=0,
            **sampling,
        )
        input_ids = torch.tensor(job.prompts)
        clock = _TokenClock()
        torch.manual_seed(0)
        start = time.perf_counter()
        with torch.inference_mode():
            out = models.hf.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=config,
                streamer=clock,
            )
        wall = time.perf_counter() - start
        generated = out[:, input_ids.shape[1] :].tolist()
        assert all(len(row) == max_new for row in generated)
        return Run(
            wall_s=wall,
            prefill_s=clock.times[1] - start,
            tokens=[row[:n] for row, n in zip(generated, job.lengths, strict=True)],
        )

    return run


def hf_generate_batch_runner(models: Models, workload: Workload) -> Runner:
    """transformers continuous batching (paged, sdpa) with a pinned cache: the same page count
    and page size as our paged pool, a persistent manager, no CUDA-graph warm-up."""
    blocks_per_request = -(-(workload.prompt_len + workload.max_new) // PAGE_SIZE)
    cb_config = ContinuousBatchingConfig(
        page_size=PAGE_SIZE,
        num_blocks=workload.num_requests * blocks_per_request,
        max_batch_tokens=max(1024, workload.num_requests * workload.prompt_len),
        max_requests_per_batch=workload.num_requests,
        max_blocks_per_request=blocks_per_request,
    )
    if models.hf.config._attn_implementation != "sdpa":  # 5.24: "sdpa" is its paged sdpa
        raise RuntimeError("generate_batch needs the sdpa attention implementation")

    def run(job: Job) -> Run:
        assert job.greedy and job.group == 1 and len(set(job.lengths)) == 1
        config = GenerationConfig(
            max_new_tokens=job.lengths[0], do_sample=False, eos_token_id=None, pad_token_id=0
        )
        start = time.perf_counter()
        with torch.inference_mode():
            outputs = models.hf.generate_batch(
                job.prompts,
                generation_config=config,
                continuous_batching_config=cb_config,
                persistent_manager=True,
                warmup=False,
            )
        wall = time.perf_counter() - start
        tokens = [o.generated_tokens for o in outputs.values()]
        assert len(tokens) == len(job.prompts) and all(len(t) == job.lengths[0] for t in tokens)
        return Run(wall_s=wall, prefill_s=None, tokens=tokens)

    return run


def naive_runner(models: Models, workload: Workload) -> Runner:
    """No cache: the full forward over the whole sequence at every step, argmax of the last."""

    def run(job: Job) -> Run:
        assert job.greedy and job.group == 1 and len(set(job.lengths)) == 1
        ids = torch.tensor(job.prompts)
        step_times = []
        start = time.perf_counter()
        with torch.inference_mode():
            for _ in range(job.lengths[0]):
                logits = models.hf(ids, use_cache=False, logits_to_keep=1).logits
                ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
                step_times.append(time.perf_counter())
        wall = time.perf_counter() - start
        tokens = ids[:, len(job.prompts[0]) :].tolist()
        return Run(wall_s=wall, prefill_s=step_times[0] - start, tokens=tokens)

    return run


def make_runners(models: Models, workload: Workload, logprobs: bool) -> dict[str, Runner]:
    runners: dict[str, Runner] = {}
    for engine in workload.engines:
        if engine in ("ours", "ours+group"):
            for strategy in workload.strategies:
                name = engine.replace("ours", f"ours-{strategy}")
                runners[name] = ours_runner(
                    models, workload, strategy, logprobs, share=engine == "ours+group"
                )
        elif engine == "ours-cold" and "paged" in workload.strategies:
            runners["ours-paged(cold)"] = ours_runner(
                models, workload, "paged", logprobs, fresh=True
            )
        elif engine == "ours-updated":
            runners["ours-paged(updated)"] = ours_runner(
                models, workload, "paged", logprobs, update=True
            )
        elif engine == "hf-generate":
            runners[engine] = hf_generate_runner(models, workload)
        elif engine == "hf-generate_batch":
            runners[engine] = hf_generate_batch_runner(models, workload)
        elif engine == "naive-recompute":
            runners[engine] = naive_runner(models, workload)
    return runners


# ----------------------------------------------------------------------------- presets
UNIFORM = ("ours", "hf-generate", "hf-generate_batch")
RL = ("ours", "ours+group", "hf-generate")
PREFIX = ("ours", "ours-cold", "hf-generate")
COLD_PREFIX = ("ours-updated", "hf-generate")  # a weight update before every run
LONG = ("ours", "hf-generate", "naive-recompute")
PAGED = ("paged",)
STEP = ("ours", "hf-generate")


def step_workload(num_prompts: int, prompt_len: int, max_new: int) -> Workload:
    """The cost of one decode step: a large sampled batch, a few new tokens (the demo's)."""
    return Workload(
        "step", num_prompts, prompt_len, max_new, greedy=False, engines=STEP, strategies=PAGED
    )


def presets(model: str, quick: bool) -> dict[str, list[Workload]]:
    """Workloads per kind, plus the gate's. The 0.5B shape runs smaller ones (and only the
    paged strategy outside W1) so that the whole script stays within ~15 minutes on 2 cores."""
    if quick:
        return {
            "gate": [Workload("uniform", 4, 16, 8)],
            "uniform": [Workload("uniform", b, 16, 8, engines=UNIFORM) for b in (1, 4)],
            "rl": [Workload("rl", 2, 16, 8, group=4, min_new=2, greedy=False, engines=RL)],
            "prefix": [Workload("prefix", 4, 40, 4, shared_prefix=32, engines=PREFIX)],
            "coldprefix": [Workload("coldprefix", 4, 40, 4, shared_prefix=32, engines=COLD_PREFIX)],
            "long": [Workload("long", 1, 64, 4, engines=LONG)],
            "step": [step_workload(32, 16, 4)],
        }
    if model == "tiny":
        return {
            "gate": [Workload("uniform", 32, 64, 64)],
            "uniform": [Workload("uniform", b, 64, 64, engines=UNIFORM) for b in (1, 8, 32)],
            "rl": [Workload("rl", 8, 64, 128, group=8, min_new=16, greedy=False, engines=RL)],
            "prefix": [Workload("prefix", 32, 272, 32, shared_prefix=256, engines=PREFIX)],
            "coldprefix": [
                Workload("coldprefix", 32, 544, 32, shared_prefix=512, engines=COLD_PREFIX)
            ],
            "long": [Workload("long", b, 512, 8, engines=LONG) for b in (1, 4)],
            "step": [step_workload(128, 32, 8)],
        }
    return {
        "gate": [Workload("uniform", 8, 32, 8)],
        "uniform": [Workload("uniform", b, 32, 16, engines=UNIFORM) for b in (1, 8)],
        "rl": [
            Workload(
                "rl", 4, 32, 32, group=8, min_new=4, greedy=False, engines=RL, strategies=PAGED
            )
        ],
        "prefix": [
            Workload(
                "prefix",
                4,
                272,
                8,
                shared_prefix=256,
                engines=("ours", "hf-generate"),
                strategies=PAGED,
            )
        ],
        "coldprefix": [
            Workload(
                "coldprefix", 4, 544, 8, shared_prefix=512, engines=COLD_PREFIX, strategies=PAGED
            )
        ],
        "long": [Workload("long", 1, 512, 8, engines=LONG, strategies=PAGED, repeats=1)],
        "step": [step_workload(8, 64, 16)],
    }


DEFAULT_REPEATS = {"tiny": 9, "qwen05": 3}
