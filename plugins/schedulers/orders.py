"""Waiting-queue orders of the ``continuous`` scheduler besides FCFS (its ``policy`` setting).

* ``priority`` -- (priority, arrival): vLLM's priority policy (lower value first).
* ``sjf`` -- shortest job first by a *predicted* output length: the tokens the request will
  generate, times a multiplicative lognormal error ``exp(sigma * Z)``, ``Z ~ N(0, 1)``
  (``prediction_sigma = 0``: an oracle). It shows what length prediction is worth. A
  request's error is drawn from ``(prediction_seed, request id)`` alone, with its own
  generator: the same on every instance and whatever the order of events, no global state.
  (Schedulers are built from their settings only, without the run's seed; sweep
  ``prediction_seed`` to vary the errors.) The error has median 1; a common scale factor
  would not change the order anyway.
* ``lof`` -- SGLang's ``--schedule-policy lof``, "longest output first": the waiting
  queue sorted by the request's ``max_new_tokens`` (here ``max_tokens``, or the output
  length when a request has no limit), longest first, ties in arrival order
  (``SchedulePolicy._sort_by_longest_output`` in ``sglang/srt/managers/schedule_policy.py``).
  It uses the client's limit, not a prediction.

Each order is a key, smallest served first; the same key picks preemption victims (the
largest key, i.e. the request this order would serve last), so a victim put back in the
queue is not the next one admitted.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np


class LengthPredictor:
    """Predicted output length of each request: ``target_tokens * exp(sigma * Z)``.

    With a large sigma the factor leaves the float range (``exp(710)`` overflows): a prediction
    beyond it is infinite or 0, and the queue is ordered by its logarithm (:meth:`log_length`),
    which keeps the order of the exact predictions for any sigma."""

    def __init__(self, sigma: float = 0.0, seed: int = 0):
        self.sigma = sigma
        self.seed = seed
        self._memo: dict[int, float] = {}

    def __call__(self, request) -> float:
        if not self.sigma:
            return float(request.target_tokens)
        try:
            return math.exp(self.log_length(request))
        except OverflowError:
            return math.inf

    def log_length(self, request) -> float:
        """``log(target_tokens) + sigma * Z``: the prediction's logarithm, finite where it is not."""
        if not self.sigma:
            return math.log(request.target_tokens)
        value = self._memo.get(request.id)
        if value is None:
            z = np.random.default_rng((self.seed, request.id)).standard_normal()
            value = self._memo[request.id] = math.log(request.target_tokens) + self.sigma * z
        return value


def priority_key(seq):
    return (seq.request.priority, seq.request.arrival_ms)


def longest_output_key(seq):
    return (-seq.request.max_output_tokens, seq.request.arrival_ms)


def shortest_predicted_key(predict: LengthPredictor) -> Callable:
    if not predict.sigma:   # the exact lengths, compared as whole numbers
        def key(seq):
            return (predict(seq.request), seq.request.arrival_ms)
        return key

    def noisy_key(seq):
        return (predict.log_length(seq.request), seq.request.arrival_ms)
    return noisy_key


def waiting_key(policy: str, sigma: float = 0.0, seed: int = 0) -> Callable | None:
    """The key ordering waiting requests under ``policy``; None for FCFS (arrival order,
    preempted requests back at the front)."""
    if policy == "priority":
        return priority_key
    if policy == "sjf":
        return shortest_predicted_key(LengthPredictor(sigma, seed))
    if policy == "lof":
        return longest_output_key
    return None
