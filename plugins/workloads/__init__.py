"""Built-in workloads: request files, published traces, generated load, mixes, closed loops.

Registered names (``[workload] kind = ...``):

* ``file`` -- requests from a JSON, JSONL or CSV file (:mod:`.request_file`);
* ``inline`` -- requests listed in the experiment itself (:mod:`.request_file`);
* ``synthetic`` -- lengths from distributions, Poisson/gamma/constant/all-at-once arrivals (:mod:`.synthetic`);
* ``shared_prefix`` -- requests sharing system prompts (:mod:`.synthetic`);
* ``diurnal`` -- a day of traffic whose rate follows the hour (:mod:`.diurnal`);
* ``azure``, ``vidur``, ``mooncake``, ``burstgpt`` -- published traces (:mod:`.traces`);
* ``mix`` -- several classes merged by arrival time (:mod:`.mix`);
* ``closed_loop`` -- N clients, each waiting for its previous request (:mod:`.closed_loop`);
* ``vllm_log``, ``vllm_bench`` -- measured vLLM runs, kept for comparison (:mod:`.measured`);
* ``inference_perf``, ``guidellm``, ``mlenergy`` -- a load generator's per-request report, the same
  way (:mod:`.inference_perf`, :mod:`.guidellm`, :mod:`.mlenergy`).

Shared pieces: :mod:`.records` reads request files, :mod:`.distributions` holds the length
distributions, :mod:`.arrivals` the arrival processes and seeded streams, :mod:`.columns` turns
numpy columns into Request objects lazily.
"""

from __future__ import annotations

import functools

import schedlab

from .closed_loop import ClosedLoopConfig, make_closed_loop_workload
from .diurnal import DiurnalConfig, make_diurnal_workload
from .guidellm import GuidellmConfig, make_guidellm_workload
from .inference_perf import InferencePerfConfig, make_inference_perf_workload
from .measured import VllmBenchConfig, VllmLogConfig, make_vllm_bench_workload, make_vllm_log_workload
from .mix import MixConfig, builtin_lookup, make_mix_workload, registry_lookup
from .mlenergy import MlenergyConfig, make_mlenergy_workload
from .request_file import FileConfig, InlineConfig, make_file_workload, make_inline_workload
from .synthetic import SharedPrefixConfig, SyntheticConfig, make_shared_prefix_workload, make_synthetic_workload
from .traces import (
    AzureConfig, BurstgptConfig, MooncakeConfig, VidurConfig, make_azure_workload, make_burstgpt_workload,
    make_mooncake_workload, make_vidur_workload,
)


@schedlab.hookimpl
def schedlab_register_workloads(register) -> None:
    register("file", make_file_workload, config=FileConfig,
             help="requests from a JSON, JSONL or CSV file; the file's arrival times, or Poisson, gamma, constant-rate "
                  "or all-at-once arrivals")
    register("inline", make_inline_workload, config=InlineConfig,
             help="requests listed in the experiment itself (requests = [{prompt_tokens = , output_tokens = }, ...])")
    register("synthetic", make_synthetic_workload, config=SyntheticConfig,
             help="N requests (or stages) with lengths from distributions and Poisson, gamma, constant-rate or "
                  "all-at-once arrivals")
    register("shared_prefix", make_shared_prefix_workload, config=SharedPrefixConfig,
             help="requests sharing system prompts: groups, shared fraction, uniform or Zipf popularity")
    register("diurnal", make_diurnal_workload, config=DiurnalConfig,
             help="a day of traffic: Poisson arrivals at an hourly rate (cosine day or your profile)")
    register("azure", make_azure_workload, config=AzureConfig,
             help="Azure LLM inference trace 2023 (TIMESTAMP,ContextTokens,GeneratedTokens)")
    register("vidur", make_vidur_workload, config=VidurConfig,
             help="Vidur splitwise trace (arrived_at,num_prefill_tokens,num_decode_tokens)")
    register("mooncake", make_mooncake_workload, config=MooncakeConfig,
             help="Mooncake FAST'25 JSONL trace with prefix hash ids; optional arrival jitter")
    register("burstgpt", make_burstgpt_workload, config=BurstgptConfig,
             help="BurstGPT CSV trace (ChatGPT and GPT-4 requests over months); failed requests dropped")
    register("vllm_log", make_vllm_log_workload, config=VllmLogConfig,
             help="a measured vLLM run's per-request log: arrivals from queued_ts, prompt token ids as "
                  "prefix block ids; measured latencies kept for comparison")
    register("vllm_bench", make_vllm_bench_workload, config=VllmBenchConfig,
             help="a `vllm bench serve --save-result --save-detailed` file: its client replayed as it ran "
                  "(send times, --max-concurrency); measured latencies kept for comparison")
    register("mlenergy", make_mlenergy_workload, config=MlenergyConfig,
             help="an ML.ENERGY benchmark results.json: its requests all at once with their lengths (set "
                  "max_num_seqs to the run's batch); measured latencies kept for comparison")
    register("inference_perf", make_inference_perf_workload, config=InferencePerfConfig,
             help="an inference-perf per_request_lifecycle_metrics.json: requests at their send times, prefix "
                  "sharing from the prompts' text; measured latencies kept for comparison")
    register("guidellm", make_guidellm_workload, config=GuidellmConfig,
             help="one benchmark of a guidellm JSON report: its requests at their start times (synchronous and "
                  "concurrent benchmarks as closed loops of their streams, throughput of its max_concurrency, "
                  "constant and poisson capped by theirs), prefix sharing from the prompts' text; measured "
                  "latencies kept for comparison")
    # A registry can look up any workload, including plugins'; a bare callable cannot.
    lookup = registry_lookup(register) if hasattr(register, "get") else builtin_lookup
    register("mix", functools.partial(make_mix_workload, lookup=lookup), config=MixConfig,
             help="several request classes, each its own open-loop workload, merged by arrival time")
    register("closed_loop", make_closed_loop_workload, config=ClosedLoopConfig,
             help="N concurrent clients, each sending its next request when the previous one finishes")
