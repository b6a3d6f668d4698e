"""When a run has diverged: one rule for the runner's summary, the figures and the advisor.

A seed has *diverged* at the first step whose training loss

* is not finite (NaN or +-inf), or
* exceeds ``FACTOR`` times its *reference*, the seed's first step's training loss:
  ``loss_t > FACTOR * loss_1`` (FACTOR = 10).

SGD that converges (or merely stalls) never multiplies its training loss by 10: the loss at step 1
is that of the initial model, which every useful update lowers.  An unstable method (signSGD
without error feedback at SGD's learning rate, error feedback around an unbiased compressor with
omega >= 1, a learning rate past 2/L) grows geometrically, and is past 10x long before it
overflows: a probe that went 2.5 -> 1.6e14 in 30 steps is diverged at the step it first passed 25,
not "stalled".  The runner stops counting a seed at that step (its line is written), marks it
``diverged`` in ``summary.json`` with the numbers, and the advisor flags the candidate.  A reference
that is not a positive finite number (a loss of 0 at step 1) leaves only the non-finite rule.
"""

from __future__ import annotations

import math

FACTOR = 10.0


def reason(loss: float, reference: float | None, step: int, factor: float = FACTOR) -> str | None:
    """Why the seed diverged at ``step`` (one line, with the numbers), or None when it has not."""
    if not math.isfinite(loss):
        return f"non-finite loss ({loss}) at step {step}"
    if reference is not None and math.isfinite(reference) and reference > 0 and loss > factor * reference:
        return f"loss {loss:.4g} at step {step} > {factor:g} x the first step's {reference:.4g}"
    return None
