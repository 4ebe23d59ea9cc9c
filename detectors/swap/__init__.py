"""Activation swapping: which saved tensors to offload to host memory, and when to fetch them.

A training step that does not fit in device memory can copy the tensors autograd saves for
backward to host memory during the forward pass and bring them back before backward needs
them; done well, the copies hide behind compute. This package is the pure half: a
**simulator** (:func:`simulate`, :func:`baselines`) that replays a profiled step under a
policy, and a **generator** (:func:`generate`) that writes a policy for a memory budget.
``collector/integrations/swap.py`` applies policies in the training process.

Built on:

- vDNN (Rhu et al., MICRO 2016, arXiv 1602.08124): offload activations to pinned host
  memory on a side stream during forward, prefetch them ahead of backward.
- SwapAdvisor (Huang et al., ASPLOS 2020): plan swaps from the whole op sequence and judge a
  plan with a simulator of memory and the copy engines.
- Capuchin (Peng et al., ASPLOS 2020): choose tensors by their *free time* (how long they sit
  idle between producer and consumer, less the copies), prefetch on an earlier tensor
  access (the "in-trigger"), recompute cheap ones instead (the hybrid; only the
  checkpointing baseline uses recomputation here).
- Chameleon (arXiv 2509.11076): in eager mode the op sequence changes; watch it with a light
  profiler and regenerate the policy per sequence. Hence a generator fast enough to run on
  every new sequence (10,000 ops in well under a second; ``bench/swap_policy.py``).

PROFILE (one profiled step; ``collector.integrations.profile``) and POLICY are JSON dicts::

    profile = {"fingerprint": "…", "ops": [{"i", "phase", "module", "start_s", "duration_s"}],
               "saved": [{"id", "storage", "bytes", "producer", "consumer", "last_use",
                          "param"}], "param_bytes", "grad_bytes", "optimizer_bytes", "step_s"}
    policy = {"version", "fingerprint", "budget_bytes", "bandwidth_bytes_per_s", "feasible",
              "offload": [{"storage", "bytes", "prefetch_at"}], "recompute": [],
              "predicted_peak_bytes", "predicted_exposed_s", "predicted_step_s",
              "storage_bytes", "consumers", "params", "base_bytes"}

    >>> ops = [{"start_s": float(i), "duration_s": 1.0} for i in range(6)]
    >>> saved = [{"storage": k, "bytes": 100, "producer": k, "consumer": 5 - k,
    ...           "last_use": 5 - k} for k in range(3)]
    >>> prof = {"fingerprint": "f00d", "ops": ops, "saved": saved, "param_bytes": 10}
    >>> simulate(prof, None, bandwidth_bytes_per_s=1000.0).peak_bytes
    310
    >>> pol = generate(prof, budget_bytes=250, bandwidth_bytes_per_s=1000.0)
    >>> pol["feasible"], pol["offload"], pol["predicted_peak_bytes"], pol["predicted_exposed_s"]
    (True, [{'storage': 0, 'bytes': 100, 'prefetch_at': 4}], 210, 0.0)
"""

from detectors.swap.generate import generate, offload_everything
from detectors.swap.simulate import SimResult, baselines, simulate

__all__ = ["SimResult", "baselines", "generate", "offload_everything", "simulate"]
