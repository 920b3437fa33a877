"""What an engine step costs besides the GPU's kernels: the host's work and kernel launches.

Every iteration of a serving engine runs CPU work around the GPU's: scheduling, preparing the
inputs (token ids, positions, block tables copied to the GPU), launching the kernels, and
processing the sampled tokens (stop checks, the requests' state). With tensor parallelism
vLLM's multiprocessing executor also broadcasts each step's scheduler output to the worker
processes through shared memory and reads the result back (``MultiprocExecutor``,
``shm_broadcast.MessageQueue``). This module turns that into time, one implementation that
both the ``roofline`` and ``profiled`` cost models compose with their GPU time::

    launch = layers x eager_layer_us     if the kernels are launched one by one, else 0
             (CUDA graphs replay batches of up to cuda_graph_max_tokens tokens in one launch;
             with cuda_graph_prefill false only those without a prefill)
    host   = host_step_us + host_per_seq_us x sequences  [+ tp_step_us at tensor parallel > 1]

    async_scheduling:  step = max(max(gpu, launch) + async_gap_us, host + launch)
    otherwise:         step = host + max(gpu, launch)

    + overhead_ms (a fixed time the cost model adds on top, e.g. fitted by schedlab calibrate)

Kernel launches run ahead of the GPU (they are asynchronous), so the GPU is late only where
launching takes longer than running. With asynchronous scheduling (vLLM's default since
December 2025, #27614; SGLang's overlap scheduler; TensorRT-LLM's) the host prepares step
N + 1 while the GPU runs step N, so its work shows only where it takes longer than the GPU's,
plus a small gap between steps; without it (``--no-async-scheduling``, vLLM before 0.13,
SGLang ``--disable-overlap-schedule``) the host's work adds to every step. Launching and the
host's work share the Python interpreter (one GIL), so they add up on the host's side.

For a decode-only batch the host's and the launch's parts do not change from step to step,
so a step is ``max(gpu + shift, floor) + add`` with constants: :meth:`StepTiming.decode_increment`
tells the engine how long the GPU's growth holds unchanged and when it is hidden.

Defaults (:data:`DEFAULTS`), from public measurements:

* ``async_gap_us = 160``: with scheduling overlapped and CUDA graphs, the GPU still idled
  150-170 us between two decode steps (Llama-2-7B, 256 sequences, vLLM V1: PR #11133).
* ``host_step_us = 400``, ``host_per_seq_us = 20``: the same PR measured 5-6 ms between decode
  steps at 256 sequences while scheduling was synchronous (400 + 256 x 20 = 5.5 ms). The fixed
  part is bounded by PR #17866: the input preparation alone took about 0.27 ms a step at one
  sequence (its fast path saved 10% of a 2.73 ms TPOT, Llama-3.2-1B); update_from_output is
  1.1 us a sequence of it (0.142 ms at 128, 0.287 at 256; PR #46112).
* ``tp_step_us = 150``: the scheduler output pickled into shared memory and read by every
  worker, and the sampled tokens sent back (workers busy-poll the queue, so the wake-up is
  microseconds). No public measurement isolates it: an estimate, hidden by asynchronous
  scheduling wherever the GPU step is longer.
* ``eager_layer_us = 262``: Llama-3.1-8B decodes a token in 8.4 ms launched kernel by kernel
  and in 5.1 ms replayed as a CUDA graph on an H100 SXM (cloudai.pt, "CUDA Graphs +
  torch.compile: 1.65x LLM Decode Speedup", citing Spheron and Fireworks AI): launching one
  of its 32 layers takes 8.4 ms / 32.
* ``cuda_graph_max_tokens = 512``: vLLM captures graphs up to ``min(2 x max_num_seqs, 512,
  max_num_batched_tokens)`` tokens (``VllmConfig._set_cudagraph_sizes``).
* ``cuda_graph_prefill = true``: a step within ``cuda_graph_max_tokens`` replays a graph whether
  or not it holds a prefill (vLLM's piecewise graphs); TGI replays one only for a decode-only
  pass (``FlashCausalLM.forward``: ``if cu_seqlen_prefill is not None or cuda_graph is None``
  runs eagerly), which the ``tgi`` scheduler sets with ``false``.

The per-operator profiles of the ``profiled`` model were measured in eager mode (LLMServingSim's
profiler, ``enforce_eager: true``) but hold GPU kernel times, so they stand for both modes; the
launch cost above is what eager mode adds.
"""

from __future__ import annotations

import math

from schedlab.configs import bool_field, float_field, int_field

#: Default of every setting, with its help text (sources in the module docstring).
DEFAULTS: dict[str, tuple[object, str]] = {
    "async_scheduling": (True, "the host prepares the next step while the GPU runs this one (vLLM's default since "
                               "0.13; false: --no-async-scheduling, SGLang --disable-overlap-schedule)"),
    "cuda_graphs": (True, "batches of up to cuda_graph_max_tokens tokens replay a captured CUDA graph (false: "
                          "--enforce-eager, every kernel launched from Python)"),
    "cuda_graph_max_tokens": (512, "largest batch (tokens) with a captured CUDA graph: vLLM min(2 x max_num_seqs, "
                                   "512, max_num_batched_tokens)"),
    "cuda_graph_prefill": (True, "a step that holds a prefill replays a graph too when within cuda_graph_max_tokens "
                                 "(vLLM's piecewise graphs); false: decode-only steps only (TGI's FlashCausalLM.forward)"),
    "host_step_us": (400.0, "host work per step, us: scheduling, input preparation, output processing"),
    "host_per_seq_us": (20.0, "host work per sequence in the step, us"),
    "tp_step_us": (150.0, "tensor parallel > 1: the scheduler output broadcast to the workers and the result read "
                          "back each step, us"),
    "eager_layer_us": (262.0, "launching one decoder layer's kernels one by one, us (without a CUDA graph)"),
    "async_gap_us": (160.0, "GPU idle between steps that asynchronous scheduling leaves, us"),
}


#: Settings that leave a step the GPU's time plus ``overhead_ms``: no host work, no launches,
#: no gap (to look at the GPU's part alone, as the tests of the cost models' composition do).
GPU_ONLY = {"async_scheduling": False, "host_step_us": 0.0, "host_per_seq_us": 0.0, "tp_step_us": 0.0,
            "eager_layer_us": 0.0, "async_gap_us": 0.0}


def step_field(name: str):
    """The attrs field of setting ``name`` (its default and help from :data:`DEFAULTS`), for a
    cost model's config class."""
    default, help = DEFAULTS[name]
    if isinstance(default, bool):
        return bool_field(default, help=help)
    if isinstance(default, int):
        return int_field(default, min=1, help=help)
    return float_field(default, min=0.0, help=help)


class StepTiming:
    """The host's and the launches' share of each step, for one model on ``tensor_parallel`` GPUs.

    :param settings: an object with the :data:`DEFAULTS` attributes and ``overhead_ms`` (a
        cost model's config).
    :param layers: decoder layers (what eager mode launches kernels for).
    """

    __slots__ = ("settings", "_async", "_graphs", "_graph_max", "_graph_prefill", "_eager_ms", "_host_ms", "_seq_ms",
                 "_gap_ms", "_add_ms")

    def __init__(self, settings, layers: int, tensor_parallel: int = 1):
        self.settings = s = settings
        self._async = s.async_scheduling
        self._graphs = s.cuda_graphs
        self._graph_max = s.cuda_graph_max_tokens
        self._graph_prefill = getattr(s, "cuda_graph_prefill", True)
        self._eager_ms = layers * s.eager_layer_us * 1e-3
        self._host_ms = (s.host_step_us + (s.tp_step_us if tensor_parallel > 1 else 0.0)) * 1e-3
        self._seq_ms = s.host_per_seq_us * 1e-3
        self._gap_ms = s.async_gap_us * 1e-3
        self._add_ms = s.overhead_ms

    # --- parts -----------------------------------------------------------------------------

    def launch_ms(self, tokens: int, prefill: bool = False) -> float:
        """CPU time to launch the step's kernels (0 when a CUDA graph replays it); ``prefill``: the
        step holds a prefill (no graph without ``cuda_graph_prefill``)."""
        graphed = self._graphs and tokens <= self._graph_max and (self._graph_prefill or not prefill)
        return 0.0 if graphed else self._eager_ms

    def host_ms(self, sequences: int) -> float:
        """The host's work for a step of ``sequences`` sequences (with the tensor-parallel broadcast)."""
        return self._host_ms + self._seq_ms * sequences

    def shape(self, tokens: int, sequences: int, prefill: bool = False) -> tuple[float, float, float]:
        """``(shift, floor, add)`` with ``step = max(gpu + shift, floor) + add`` for this batch."""
        launch = self.launch_ms(tokens, prefill)
        host = self.host_ms(sequences)
        if self._async:
            gap = self._gap_ms
            return gap, max(launch + gap, host + launch), self._add_ms
        return 0.0, launch, host + self._add_ms

    # --- composition -----------------------------------------------------------------------

    def step_ms(self, gpu_ms: float, tokens: int, sequences: int, prefill: bool = False) -> float:
        """The step's duration given the GPU's time for its kernels (hot path: inline); ``prefill``:
        the step holds a prefill."""
        launch = 0.0 if self._graphs and tokens <= self._graph_max and (self._graph_prefill or not prefill) \
            else self._eager_ms
        busy = gpu_ms if gpu_ms > launch else launch
        host = self._host_ms + self._seq_ms * sequences
        if self._async:
            busy += self._gap_ms
            host += launch
            return (busy if busy > host else host) + self._add_ms
        return busy + host + self._add_ms

    def decode_increment(self, gpu_ms: float, gpu_increment: float, gpu_steps: float, tokens: int,
                         sequences: int) -> tuple[float, int]:
        """For a decode-only run whose GPU time starts at ``gpu_ms`` and grows by
        ``gpu_increment`` a step for ``gpu_steps`` steps (``math.inf``: for ever): the step's
        increment and how many steps of the run it holds for (``math.inf``: for ever)."""
        shift, floor, _ = self.shape(tokens, sequences)
        busy = gpu_ms + shift
        if busy >= floor:
            return gpu_increment, gpu_steps
        if gpu_increment <= 0.0:
            return 0.0, gpu_steps
        # Flat at the floor while busy + j * increment stays at or below it (j = 0 .. held - 1).
        held = (floor - busy) / gpu_increment
        if not held < gpu_steps:  # (also a vanishing increment: held is inf)
            return 0.0, gpu_steps
        return 0.0, max(1, math.ceil(held))
