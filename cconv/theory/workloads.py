"""The survey's workloads: ResNet-50, BERT-Base and BERT-Large, with their tensor shapes.

Shi et al. ("Communication-Efficient Distributed Deep Learning: Survey, Evaluation, and
Challenges", Sec. 2 and 4.1) characterise a model by D parameters and C operations per sample
per iteration (model intensity I = C/D), and train with local mini-batches of 64, 64 and 8 on
RTX 2080Ti GPUs.  The presets here:

============  ==============  ============================  =====  ==================================
workload      D (from shapes)  C (FLOPs/sample)              M      source of C
============  ==============  ============================  =====  ==================================
resnet50      25,557,032       470 D  = 1.201e10             64     I = 470 (survey)
bert-base     109,482,240      249 D  = 2.726e10             64     I = 249 (survey)
bert-large    335,141,888      597e9 / 8 = 7.463e10          8      597 GFLOPs per iteration at batch 8
============  ==============  ============================  =====  ==================================

D is computed from the layer shapes below (torchvision's ResNet-50 with 1000 classes; Hugging
Face's BertModel with pooler, vocabulary 30522, 512 positions), matching the survey's 25.5 M,
110 M and 336 M (1.34 GB in fp32).  For BERT-Large the survey's two numbers disagree: 597e9/8
FLOPs over 335 M parameters is I = 223, not 248; but over the 302 M *non-embedding*
parameters (the transformer layers) it is 247, so the survey's I evidently counts those
(``tests/test_theory_planner.py::test_bert_large_intensity_matches_non_embedding_params``).  The
preset keeps the measured 597 GFLOPs, which is what the 163 ms compute time refers to.

Device speed: ``SURVEY_DEVICE_FLOPS`` = 597e9 / 0.163 s = 3.66 TFLOP/s, the rate the survey's
RTX 2080Ti achieved on BERT-Large (the planner's default ``--device-flops``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cconv.theory import profiles

BERT_LARGE_FLOPS_PER_ITER = 597e9
BERT_LARGE_COMPUTE_S = 0.163
SURVEY_DEVICE_FLOPS = BERT_LARGE_FLOPS_PER_ITER / BERT_LARGE_COMPUTE_S


class Workload(NamedTuple):
    """A model to plan for: D parameters in ``shapes``, C FLOPs per sample, local batch M."""

    name: str
    params: int
    flops_per_sample: float
    batch: int
    shapes: tuple[tuple[int, ...], ...]  # parameter tensors in forward order; () when unknown
    source: str = ""

    @property
    def intensity(self) -> float:
        """Model intensity I = C / D (Shi et al.)."""
        return self.flops_per_sample / self.params


def resnet50_shapes(num_classes: int = 1000, blocks_per_stage: tuple[int, ...] = (3, 4, 6, 3)) -> list[tuple[int, ...]]:
    """Trainable tensors of ResNet-50 (He et al. 2016; torchvision layout, Flax kernel order);
    ``blocks_per_stage=(3, 4, 23, 3)`` gives ResNet-101."""
    shapes: list[tuple[int, ...]] = [(7, 7, 3, 64), (64,), (64,)]
    cin = 64
    for width, blocks in zip((64, 128, 256, 512), blocks_per_stage):
        for b in range(blocks):
            shapes += [
                (1, 1, cin, width),
                (width,),
                (width,),
                (3, 3, width, width),
                (width,),
                (width,),
                (1, 1, width, 4 * width),
                (4 * width,),
                (4 * width,),
            ]
            if b == 0:
                shapes += [(1, 1, cin, 4 * width), (4 * width,), (4 * width,)]
            cin = 4 * width
    shapes += [(cin, num_classes), (num_classes,)]
    return shapes


def bert_shapes(
    hidden: int, layers: int, ffn: int, vocab: int = 30522, positions: int = 512, types: int = 2
) -> list[tuple[int, ...]]:
    """Trainable tensors of BERT (Devlin et al. 2019; Hugging Face BertModel with pooler)."""
    h = hidden
    shapes: list[tuple[int, ...]] = [(vocab, h), (positions, h), (types, h), (h,), (h,)]
    for _ in range(layers):
        shapes += [(h, h), (h,)] * 4  # query, key, value, attention output
        shapes += [(h,), (h,)]  # attention LayerNorm
        shapes += [(h, ffn), (ffn,), (ffn, h), (h,), (h,), (h,)]  # FFN + LayerNorm
    shapes += [(h, h), (h,)]  # pooler
    return shapes


def vgg16_shapes(num_classes: int = 1000) -> list[tuple[int, ...]]:
    """Trainable tensors of VGG-16 (configuration D, torchvision without BatchNorm)."""
    shapes: list[tuple[int, ...]] = []
    cin = 3
    for v in (64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512):
        shapes += [(3, 3, cin, v), (v,)]
        cin = v
    for a, b in ((512 * 7 * 7, 4096), (4096, 4096), (4096, num_classes)):
        shapes += [(a, b), (b,)]
    return shapes


def gpt2_shapes(h: int = 768, layers: int = 12, vocab: int = 50257, positions: int = 1024) -> list[tuple[int, ...]]:
    """Trainable tensors of GPT-2 small (Hugging Face GPT2LMHeadModel; the LM head tied to wte)."""
    shapes: list[tuple[int, ...]] = [(vocab, h), (positions, h)]
    for _ in range(layers):
        shapes += [(h,), (h,), (h, 3 * h), (3 * h,), (h, h), (h,)]  # ln_1, c_attn, attn.c_proj
        shapes += [(h,), (h,), (h, 4 * h), (4 * h,), (4 * h, h), (h,)]  # ln_2, c_fc, mlp.c_proj
    return shapes + [(h,), (h,)]  # ln_f


def lstm_shapes(hidden: int = 1500, layers: int = 2, vocab: int = 10000) -> list[tuple[int, ...]]:
    """Trainable tensors of the two-layer LSTM language model (Zaremba et al. 2014, "large")."""
    h = hidden
    shapes: list[tuple[int, ...]] = [(vocab, h)]
    for _ in range(layers):
        shapes += [(h, 4 * h), (h, 4 * h), (4 * h,), (4 * h,)]  # W_ih, W_hh, b_ih, b_hh
    return shapes + [(h, vocab), (vocab,)]


def embedding_params(w: Workload) -> int:
    """Parameters of the embedding tables (BERT: word + position + token type)."""
    if not w.name.startswith("bert"):
        return 0
    return sum(int(np.prod(s)) for s in w.shapes[:3])


def _make(name, shapes, flops, batch, source):
    shapes = tuple(tuple(int(v) for v in s) for s in shapes)
    d = sum(int(np.prod(s)) for s in shapes)
    return Workload(name, d, float(flops(d)), batch, shapes, source)


WORKLOADS: dict[str, Workload] = {
    "resnet50": _make(
        "resnet50",
        resnet50_shapes(),
        lambda d: 470 * d,
        64,
        "survey: I = 470, 25.5 M parameters, local batch 64 (224x224 images)",
    ),
    "bert-base": _make(
        "bert-base",
        bert_shapes(768, 12, 3072),
        lambda d: 249 * d,
        64,
        "survey: I = 249, 110 M parameters, local batch 64 (64-token sentences)",
    ),
    "bert-large": _make(
        "bert-large",
        bert_shapes(1024, 24, 4096),
        lambda d: BERT_LARGE_FLOPS_PER_ITER / 8,
        8,
        "survey: 597 GFLOPs per iteration at local batch 8, 336 M parameters",
    ),
}

# Workloads beyond the survey's: C is the layer profile's count (cconv.theory.profiles: 2 FLOPs per
# multiply-accumulate, backward = 2 x forward), M the profile's local batch, the sources there.
_PROFILED = {
    "resnet101": (resnet50_shapes(1000, (3, 4, 23, 3)), "torchvision ResNet-101 v1.5, 224x224 images, batch 64"),
    "vgg16": (vgg16_shapes(), "VGG-16 (configuration D), 224x224 images, batch 64"),
    "gpt2": (gpt2_shapes(), "GPT-2 small (124 M), 1024-token sequences, batch 8"),
    "lstm": (lstm_shapes(), "2-layer LSTM LM (Zaremba et al. 2014 large: 1500 units, PTB), 35 steps, batch 20"),
    # the shapes of Global-QSGD's two workloads are their layer profiles' (cconv.theory.profiles)
    "wide-resnet101-2": (None, "torchvision Wide ResNet-101-2, 224x224 images, batch 16 (Global-QSGD's runs)"),
    "transformer-xl": (None, "Transformer-XL base, WikiText-103, 192-token segments, batch 64 (Global-QSGD's runs)"),
    "lstm-wt2": (None, "2-layer tied LSTM LM (1500 units, WikiText-2), 70 steps, batch 80 (Espresso's runs)"),
    "bert-base-squad": (None, "BERT-Base on SQuAD v1.1, 384-token sequences, batch 8 (Espresso's runs)"),
}
for _name, (_shapes, _src) in _PROFILED.items():
    _prof = profiles.get(_name)
    if _shapes is None:
        _shapes = [sh for lay in reversed(_prof.layers) for sh in lay.shapes]
    WORKLOADS[_name] = _make(_name, _shapes, lambda d, c=_prof.flops_per_sample: c, _prof.batch, _src)


def names() -> list[str]:
    return list(WORKLOADS)


def get(name: str) -> Workload:
    if isinstance(name, str) and name.lower() in WORKLOADS:
        return WORKLOADS[name.lower()]
    raise ValueError(f"unknown workload {name!r}; valid: {', '.join(names())}")


def custom(params: int, flops_per_sample: float, batch: int, name: str = "custom") -> Workload:
    """A workload known only by D, C and M: one flat tensor of D parameters."""
    for what, v in (("params", params), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{what} must be an integer >= 1, got {v!r}")
    if (
        isinstance(flops_per_sample, bool)
        or not isinstance(flops_per_sample, (int, float))
        or not np.isfinite(flops_per_sample)
        or flops_per_sample <= 0
    ):
        raise ValueError(f"flops_per_sample must be a number > 0, got {flops_per_sample!r}")
    return Workload(name, int(params), float(flops_per_sample), int(batch), ((int(params),),), "")
