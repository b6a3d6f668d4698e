"""Layer profiles: per-layer forward FLOPs, backward FLOPs and gradient bytes, in backprop order.

A ``Profile`` is what a schedule simulator needs of a model: for every layer (last layer first,
the order in which backpropagation produces the gradients) the forward and backward FLOPs of one
iteration at the local mini-batch ``batch``, and the bytes of its gradient (fp32).  Backward time
is spread over layers by FLOPs, not by parameter count: BERT's embedding tables hold a fifth to
a quarter of its parameters and take almost no FLOPs.

What is counted (all presets and ``from_apply``):

* forward FLOPs = 2 x multiply-accumulates of the matrix products and convolutions (dense layers,
  convolutions, and BERT's attention products Q K^T and A V, folded into the attention-output
  layer that consumes them).  BatchNorm, LayerNorm, activations, softmax, pooling and residual
  additions are not counted (a few percent: 0.3 % of ResNet-50's and 1-2 % of BERT's
  forward FLOPs);
* backward FLOPs = 2 x forward (the gradient with respect to the weights and to the layer's input,
  one product each); the first layer (last in backprop order) computes no input gradient, so its
  backward is 1 x forward;
* gradient bytes = 4 x the layer's trainable parameters (a convolution's or dense layer's kernel
  with the BatchNorm / LayerNorm that follows it, or its bias).

Presets (``names()``), at the survey's local batches (Shi et al., "Communication-Efficient
Distributed Deep Learning: Survey, Evaluation, and Challenges", Sec. 4.1):

============  ======  ====================  ======================  ===========================
preset        layers  D (= workloads.py)    C = fwd+bwd FLOPs/sample  survey C (workloads.py)
============  ======  ====================  ======================  ===========================
resnet50      54      25,557,032            2.43e10                 1.20e10 (I = 470)
bert-base     74      109,482,240           3.31e10                 2.73e10 (I = 249)
bert-large    146     335,141,888           1.17e11                 7.46e10 (597 GFLOPs / 8)
============  ======  ====================  ======================  ===========================

* ``resnet50``: torchvision's ResNet-50 (He et al. 2016, v1.5: stride on the 3x3 convolution),
  224x224x3 inputs: conv1 7x7/2 + BN, max-pool, 16 bottleneck blocks (1x1, 3x3, 1x1 convolutions,
  each + BN; a 1x1 projection + BN in each stage's first block), global average pool, fc 2048 ->
  1000.  4.09 G multiply-accumulates per image forward, the well-known figure;
* ``bert-base`` / ``bert-large``: Hugging Face's BertModel (Devlin et al. 2019) with 64-token
  sentences (the survey's samples): the embeddings (word, position, token type, LayerNorm: no
  FLOPs), per encoder layer the query, key, value and attention-output dense layers (the last
  with the attention products and the LayerNorm), the intermediate and output dense layers (the
  last with its LayerNorm), and the pooler (on the [CLS] token only).

The survey's C is not 2 x MACs x 3: for ResNet-50 it is 3 x MACs (a multiply-accumulate counted
as one operation: 3 x 4.09e9 = 1.23e10 vs 1.20e10, 2 % apart), for BERT it is lower than ours by
18 % (Base) and 36 % (Large), neither 2 x nor 1 x MACs; the survey does not say how it counted.
A simulator may therefore take the *shape* of a profile (how FLOPs and bytes are spread over
layers) and the total from the survey's measurement: ``scaled(profile, flops_per_sample)``
rescales all FLOPs to a given C (e.g. the workload's), keeping the ratios.

cconv's own models: ``from_apply`` derives a profile from the model function itself, by walking
its jaxpr (``jax.make_jaxpr``): every ``dot_general`` and ``conv_general_dilated`` is charged
2 x MACs (a convolution's taps that read padding not counted, as XLA counts them) to the
top-level parameter group (the model's attribute: ``layer0``, ``block3``,
``head``, ...) whose parameters it reads, directly or through shape/type operations; products
that read no parameter (attention's Q K^T and A V) go to the group of the last product that did.
The forward order of the groups is the order in which the forward pass first reads them.
``from_model`` builds a registered model (``cconv.models``) and calls it.  Tested against the
FLOP count of the compiled whole model (``tests/test_theory_profiles.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

FLOAT_BYTES = 4  # gradients in fp32


class Layer(NamedTuple):
    """One layer of one iteration at the profile's batch: FLOPs and gradient bytes."""

    name: str
    fwd_flops: float
    bwd_flops: float
    grad_bytes: float
    shapes: tuple[tuple[int, ...], ...] = ()  # the layer's parameter tensors; () when unknown

    @property
    def tensors(self) -> tuple[tuple[int, ...], ...]:
        """The layer's tensor shapes, or one flat vector of its elements when they are unknown."""
        return self.shapes or ((int(round(self.grad_bytes / FLOAT_BYTES)),),)


class Profile(NamedTuple):
    """A model as a schedule sees it: ``layers`` in BACKPROP order (last layer first)."""

    name: str
    layers: tuple[Layer, ...]
    batch: int
    source: str
    compress_vectors: bool | None = None  # a run config's own setting (cconv plan --measure); None: not stated

    @property
    def params(self) -> int:
        """D, the number of trainable parameters (fp32 gradient bytes / 4)."""
        return int(round(sum(lay.grad_bytes for lay in self.layers) / FLOAT_BYTES))

    @property
    def fwd_flops(self) -> float:
        """Forward FLOPs of one iteration (all layers, the whole local batch)."""
        return float(sum(lay.fwd_flops for lay in self.layers))

    @property
    def bwd_flops(self) -> float:
        """Backward FLOPs of one iteration."""
        return float(sum(lay.bwd_flops for lay in self.layers))

    @property
    def flops_per_sample(self) -> float:
        """C, forward + backward FLOPs per sample (the survey's notion, ``Workload.flops_per_sample``)."""
        return (self.fwd_flops + self.bwd_flops) / self.batch


# --------------------------------------------------------------------------- construction and checks


def _number(what: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {v!r}")
    return float(v)


def _shapes(name: str, shapes: Any, grad_bytes: float) -> tuple[tuple[int, ...], ...]:
    """Checked tensor shapes whose elements add up to ``grad_bytes`` / 4 (or ``()``: unknown)."""
    try:
        out = tuple(tuple(int(v) for v in s) for s in shapes)
    except (TypeError, ValueError):
        raise ValueError(f"layer {name!r}: shapes must be a sequence of integer tuples, got {shapes!r:.60}") from None
    if any(v < 1 for s in out for v in s):
        raise ValueError(f"layer {name!r}: tensor dimensions must be >= 1, got {out!r:.60}")
    if out and sum(math.prod(s) for s in out) * FLOAT_BYTES != grad_bytes:
        raise ValueError(
            f"layer {name!r}: its shapes hold {sum(math.prod(s) for s in out)} elements, not grad_bytes / 4"
        )
    return out


def layer(name: str, fwd_flops: float, bwd_flops: float, grad_bytes: float, shapes: Any = ()) -> Layer:
    """A checked ``Layer``: a one-line ValueError for a negative or non-finite size, or for tensor
    shapes that do not hold ``grad_bytes`` / 4 elements."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a layer needs a non-empty name, got {name!r}")
    grad = _number(f"layer {name!r} grad_bytes", grad_bytes)
    return Layer(
        name,
        _number(f"layer {name!r} fwd_flops", fwd_flops),
        _number(f"layer {name!r} bwd_flops", bwd_flops),
        grad,
        _shapes(name, shapes, grad),
    )


def make(name: str, layers: Iterable[Layer | Mapping | Sequence], batch: int, source: str = "") -> Profile:
    """A checked ``Profile`` from layers in backprop order, each a ``Layer``, a mapping with keys
    name, fwd_flops, bwd_flops, grad_bytes (and optionally shapes), or a 4- or 5-sequence in that order."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"profile {name!r}: batch must be an integer >= 1, got {batch!r}")
    out = []
    for lay in layers:
        if isinstance(lay, Mapping):
            missing = [k for k in Layer._fields[:4] if k not in lay]
            if missing:
                raise ValueError(f"profile {name!r}: a layer lacks {', '.join(missing)}: {dict(lay)!r}")
            lay = [lay[k] for k in Layer._fields if k in lay]
        if not isinstance(lay, Sequence) or len(lay) not in (4, 5):
            raise ValueError(f"profile {name!r}: a layer is (name, fwd_flops, bwd_flops, grad_bytes), got {lay!r}")
        out.append(layer(*lay))
    if not out:
        raise ValueError(f"profile {name!r} has no layers")
    return Profile(str(name), tuple(out), int(batch), str(source))


def scaled(profile: Profile, flops_per_sample: float) -> Profile:
    """``profile`` with every layer's FLOPs multiplied so that C (fwd + bwd per sample) equals
    ``flops_per_sample``; bytes unchanged.  Use to keep a profile's shape with a measured total."""
    c = _number("flops_per_sample", flops_per_sample)
    if profile.flops_per_sample <= 0:
        raise ValueError(f"profile {profile.name!r} has no FLOPs to scale")
    f = c / profile.flops_per_sample
    layers = tuple(lay._replace(fwd_flops=lay.fwd_flops * f, bwd_flops=lay.bwd_flops * f) for lay in profile.layers)
    return profile._replace(layers=layers)


def _backprop(name: str, forward: list[tuple], batch: int, source: str) -> Profile:
    """Profile from (layer, forward FLOPs per iteration, parameters[, tensor shapes]) in FORWARD
    order: backward = 2 x forward, 1 x for the first layer (no input gradient); reversed into
    backprop order.  With shapes, the parameters are their elements."""
    layers = []
    for i, (n, f, p, *shapes) in enumerate(forward):
        sh = tuple(shapes[0]) if shapes else ()
        params = sum(math.prod(s) for s in sh) if sh else p
        layers.append(layer(n, f, (1.0 if i == 0 else 2.0) * f, FLOAT_BYTES * float(params), sh))
    return make(name, reversed(layers), batch, source)


# --------------------------------------------------------------------------- presets


RESNET_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}  # He et al. 2016, Table 1


def resnet(depth: int = 50, batch: int = 64, image: int = 224, num_classes: int = 1000, widen: int = 1) -> Profile:
    """torchvision ResNet-50/101 (v1.5) at ``batch`` images of ``image`` x ``image`` x 3 (module doc);
    ``widen=2``: torchvision's Wide ResNet-50-2/101-2 (Zagoruyko & Komodakis 2016; ``width_per_group``
    128: each bottleneck's inner 1x1 and 3x3 convolutions twice as wide, its output unchanged)."""
    if depth not in RESNET_BLOCKS:
        raise ValueError(f"resnet depth must be one of {', '.join(map(str, RESNET_BLOCKS))}, got {depth!r}")
    fwd: list[tuple] = []

    def conv(name: str, k: int, cin: int, cout: int, hw_out: int) -> None:
        macs = hw_out * hw_out * k * k * cin * cout
        fwd.append((name, 2.0 * macs * batch, 0, ((k, k, cin, cout), (cout,), (cout,))))  # kernel + BN scale, bias

    hw = (image + 1) // 2  # conv1 7x7 stride 2, padding 3
    conv("conv1", 7, 3, 64, hw)
    hw = (hw + 1) // 2  # max-pool 3x3 stride 2, padding 1
    cin = 64
    for s, (width, blocks) in enumerate(zip((64, 128, 256, 512), RESNET_BLOCKS[depth]), start=1):
        for b in range(blocks):
            stride = 2 if (s > 1 and b == 0) else 1
            out = hw // stride
            pre = f"layer{s}.{b}"
            inner = widen * width
            conv(f"{pre}.conv1", 1, cin, inner, hw)
            conv(f"{pre}.conv2", 3, inner, inner, out)  # v1.5: the stride is on the 3x3 convolution
            conv(f"{pre}.conv3", 1, inner, 4 * width, out)
            if b == 0:
                conv(f"{pre}.downsample", 1, cin, 4 * width, out)
            cin, hw = 4 * width, out
    fwd.append(("fc", 2.0 * cin * num_classes * batch, 0, ((cin, num_classes), (num_classes,))))
    name = f"wide-resnet{depth}-{widen}" if widen > 1 else f"resnet{depth}"
    label = f"Wide ResNet-{depth}-{widen}" if widen > 1 else f"ResNet-{depth} v1.5"
    return _backprop(name, fwd, batch, f"torchvision {label}, {image}x{image}x3 inputs, local batch {batch}")


def resnet50(batch: int = 64, image: int = 224, num_classes: int = 1000) -> Profile:
    """torchvision ResNet-50 (v1.5), the survey's workload."""
    return resnet(50, batch, image, num_classes)


VGG16_CONVS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg16(batch: int = 64, image: int = 224, num_classes: int = 1000) -> Profile:
    """VGG-16 (Simonyan & Zisserman 2015, configuration D; torchvision, no BatchNorm): 13 3x3
    convolutions with biases, 5 max-pools, fc 25088 -> 4096 -> 4096 -> classes.  138.4 M
    parameters, 15.5 G multiply-accumulates per 224 x 224 image forward."""
    fwd: list[tuple] = []
    cin, hw, i = 3, image, 0
    for v in VGG16_CONVS:
        if v == "M":
            hw //= 2
            continue
        fwd.append((f"features.conv{i}", 2.0 * hw * hw * 9 * cin * v * batch, 0, ((3, 3, cin, v), (v,))))
        cin, i = v, i + 1
    dims = (cin * 7 * 7, 4096, 4096, num_classes)  # adaptive average pool to 7 x 7
    for j, (a, b) in enumerate(zip(dims, dims[1:])):
        fwd.append((f"classifier.fc{j}", 2.0 * a * b * batch, 0, ((a, b), (b,))))
    return _backprop("vgg16", fwd, batch, f"VGG-16 (configuration D), {image}x{image}x3 inputs, local batch {batch}")


def bert(
    name: str,
    hidden: int,
    layers: int,
    ffn: int,
    batch: int,
    seq: int = 64,
    vocab: int = 30522,
    positions: int = 512,
    types: int = 2,
    whose: str = "the survey's",
) -> Profile:
    """Hugging Face BertModel with pooler at ``batch`` sentences of ``seq`` tokens (module doc)."""
    h, tokens = hidden, batch * seq
    fwd: list[tuple] = [("embeddings", 0.0, 0, ((vocab, h), (positions, h), (types, h), (h,), (h,)))]
    for i in range(layers):
        pre = f"encoder.{i}"
        for part in ("query", "key", "value"):
            fwd.append((f"{pre}.attention.{part}", 2.0 * h * h * tokens, 0, ((h, h), (h,))))
        scores_context = 2.0 * 2 * seq * h * tokens  # Q K^T and A V over all heads
        fwd.append((f"{pre}.attention.output", 2.0 * h * h * tokens + scores_context, 0, ((h, h), (h,), (h,), (h,))))
        fwd.append((f"{pre}.intermediate", 2.0 * h * ffn * tokens, 0, ((h, ffn), (ffn,))))
        fwd.append((f"{pre}.output", 2.0 * ffn * h * tokens, 0, ((ffn, h), (h,), (h,), (h,))))
    fwd.append(("pooler", 2.0 * h * h * batch, 0, ((h, h), (h,))))
    return _backprop(
        name,
        fwd,
        batch,
        f"Hugging Face BertModel (hidden {h}, {layers} layers, FFN {ffn}), {seq}-token sentences, "
        f"local batch {batch} ({whose})",
    )


def gpt2(
    batch: int = 8, seq: int = 1024, hidden: int = 768, layers: int = 12, vocab: int = 50257, positions: int = 1024
) -> Profile:
    """GPT-2 small (Radford et al. 2019; Hugging Face GPT2LMHeadModel, 124 M parameters) at ``batch``
    sequences of ``seq`` tokens: token and position embeddings (no FLOPs), per block the fused
    query/key/value projection, the attention products (Q K^T and A V, 2 x 2 seq h MACs per token,
    folded into the output projection), the MLP (h -> 4h -> h), LayerNorms with the layer after
    them; the LM head reuses the token embedding (tied), so its FLOPs sit with the final LayerNorm
    at the end of the forward pass and the embedding's gradient is complete only when
    backpropagation reaches the first layer."""
    h, tokens = hidden, batch * seq
    fwd: list[tuple] = [("wte+wpe", 0.0, 0, ((vocab, h), (positions, h)))]
    for i in range(layers):
        pre = f"h.{i}"
        fwd.append(
            (f"{pre}.attn.c_attn", 2.0 * h * 3 * h * tokens, 0, ((h,), (h,), (h, 3 * h), (3 * h,)))
        )  # ln_1 + qkv
        fwd.append((f"{pre}.attn.c_proj", 2.0 * (h * h + 2 * seq * h) * tokens, 0, ((h, h), (h,))))
        fwd.append((f"{pre}.mlp.c_fc", 2.0 * h * 4 * h * tokens, 0, ((h,), (h,), (h, 4 * h), (4 * h,))))  # ln_2 + fc
        fwd.append((f"{pre}.mlp.c_proj", 2.0 * 4 * h * h * tokens, 0, ((4 * h, h), (h,))))
    fwd.append(("ln_f+lm_head", 2.0 * h * vocab * tokens, 0, ((h,), (h,))))  # the head is tied to wte: no parameters
    return _backprop("gpt2", fwd, batch, f"GPT-2 small (124 M), {seq}-token sequences, local batch {batch}")


def lstm(
    batch: int = 20, seq: int = 35, hidden: int = 1500, layers: int = 2, vocab: int = 10000, tied: bool = False
) -> Profile:
    """The two-layer LSTM language model of the compression papers: Zaremba et al. 2014's "large"
    LSTM on Penn Treebank (2 layers of 1,500 units, 10,000-word vocabulary, 35 unrolled steps,
    batch 20, untied softmax: 66 M parameters), as trained by DGC (Lin et al. 2018) and others.
    Per token and layer the four gates cost 2 x 4 (in + h) h FLOPs; the softmax 2 h V.  ``tied``:
    the decoder reuses the embedding (Press & Wolf 2017; its bias is its only parameter), so the
    embedding's gradient is complete only when backpropagation reaches the first layer."""
    h, tokens = hidden, batch * seq
    fwd: list[tuple] = [("embedding", 0.0, 0, ((vocab, h),))]
    for i in range(layers):
        fwd.append((f"lstm.{i}", 2.0 * 4 * (h + h) * h * tokens, 0, ((h, 4 * h), (h, 4 * h), (4 * h,), (4 * h,))))
    fwd.append(("decoder", 2.0 * h * vocab * tokens, 0, ((vocab,),) if tied else ((h, vocab), (vocab,))))
    name, what = ("lstm-wt2", "tied ") if tied else ("lstm", "")
    return _backprop(
        name, fwd, batch, f"2-layer {what}LSTM LM ({h} units, vocabulary {vocab}), {seq} steps, batch {batch}"
    )


TXL_WT103_CUTOFFS = (19997, 39997, 199997)  # NVIDIA DeepLearningExamples' train.py for WikiText-103


def transformer_xl(
    batch: int = 64,
    tgt_len: int = 192,
    mem_len: int = 192,
    d_model: int = 512,
    layers: int = 16,
    d_inner: int = 2048,
    vocab: int = 267735,
) -> Profile:
    """Transformer-XL base on WikiText-103 (Dai et al. 2019; NVIDIA DeepLearningExamples' PyTorch
    MemTransformerLM, as released with Global-QSGD, sands-lab/global-qsgd models/TransformerXL):
    word embedding (vocab x d) tied to an adaptive softmax (div_val 1: one bias of ``vocab``, a 3 x d
    cluster head), the shared relative-position biases r_w, r_r (heads x d_head = d), and per layer a
    bias-free q/k/v projection (d -> 3d), position projection r_net (d -> d) and output projection
    (d -> d) with a LayerNorm, and a position-wise FFN (d -> d_inner -> d) with a LayerNorm:
    191,950,298 parameters, 54,599,680 in the layers (the log's ``n_all_param`` and
    ``n_nonemb_param``).  Per token and layer: q/k/v 2 x 3 d^2, the three attention products (AC, BD,
    AV) 3 x 2 klen d over klen = tgt_len + mem_len keys, output 2 d^2, FFN 2 x 2 d d_inner; the
    softmax head 2 d (shortlist + clusters).  Not counted: r_net on the klen positions (once per
    chunk, 0.3 % of a layer) and the tail clusters (only tokens whose target falls in them)."""
    d, tokens, klen = d_model, batch * tgt_len, tgt_len + mem_len
    shortlist = TXL_WT103_CUTOFFS[0] + len(TXL_WT103_CUTOFFS)
    fwd: list[tuple] = [("word_emb+r_bias", 0.0, 0, ((vocab, d), (d,), (d,)))]  # r_w_bias, r_r_bias: heads x d_head
    for i in range(layers):
        attn = 2.0 * (3 * d * d + 3 * klen * d + d * d) * tokens
        fwd.append((f"layers.{i}.attn", attn, 0, ((d, 3 * d), (d, d), (d, d), (d,), (d,))))
        fwd.append(
            (
                f"layers.{i}.ff",
                2.0 * 2 * d * d_inner * tokens,
                0,
                ((d, d_inner), (d_inner,), (d_inner, d), (d,), (d,), (d,)),
            )
        )
    head = ((len(TXL_WT103_CUTOFFS), d), (len(TXL_WT103_CUTOFFS),), (vocab,))  # cluster weight, bias; out bias
    fwd.append(("crit", 2.0 * d * shortlist * tokens, 0, head))
    return _backprop(
        "transformer-xl",
        fwd,
        batch,
        f"Transformer-XL base (WikiText-103, {layers} layers, d {d}), {tgt_len}-token segments, memory {mem_len}, "
        f"local batch {batch}",
    )


PRESETS: dict[str, Callable[[], Profile]] = {
    "resnet50": lambda: resnet50(64),
    "bert-base": lambda: bert("bert-base", 768, 12, 3072, 64),
    "bert-large": lambda: bert("bert-large", 1024, 24, 4096, 8),
    "resnet101": lambda: resnet(101, 64),
    "vgg16": lambda: vgg16(64),
    "gpt2": lambda: gpt2(8),
    "lstm": lambda: lstm(20),
    # Global-QSGD's runs (sands-lab/global-qsgd): --batch-size 64 over 4 GPUs (16 each); 256 segments over 4 (64)
    "wide-resnet101-2": lambda: resnet(101, 16, widen=2),
    "transformer-xl": lambda: transformer_xl(64),
    # Espresso's runs (zhuangwang93/Espresso, EuroSys'23): its LSTM (WikiText-2, 33,278 words, tied, batch 80 x 70
    # steps) and BERT-base fine-tuned on SQuAD (384-token sequences, batch 8)
    "lstm-wt2": lambda: lstm(80, 70, 1500, 2, 33278, tied=True),
    "bert-base-squad": lambda: bert("bert-base-squad", 768, 12, 3072, 8, seq=384, whose="Espresso's SQuAD runs"),
}


def names() -> list[str]:
    """Names of the preset profiles (the survey's workloads, ``cconv.theory.workloads``)."""
    return list(PRESETS)


def get(name: str) -> Profile:
    """A preset profile by name (case-insensitive)."""
    if isinstance(name, str) and name.lower() in PRESETS:
        return PRESETS[name.lower()]()
    raise ValueError(f"unknown profile {name!r}; valid: {', '.join(names())}")


# --------------------------------------------------------------------------- cconv's own models


_PASS_THROUGH = {
    "convert_element_type",
    "reshape",
    "transpose",
    "broadcast_in_dim",
    "squeeze",
    "expand_dims",
    "copy",
    "copy_p",
    "slice",
    "dynamic_slice",
    "rev",
    "pjit",
}


def _valid_taps(n: int, k: int, o: int, stride: int, lo: int, lhs_dil: int, rhs_dil: int) -> int:
    """Pairs (output position, kernel tap) of one spatial axis that read an input element, not
    padding (XLA's count)."""
    span = (n - 1) * lhs_dil + 1
    count = 0
    for i in range(o):
        for j in range(k):
            pos = i * stride - lo + j * rhs_dil
            count += 0 <= pos < span and pos % lhs_dil == 0
    return count


def _conv_macs(eqn) -> float:
    lhs, rhs = (v.aval for v in eqn.invars[:2])
    out = eqn.outvars[0].aval
    dn, prm = eqn.params["dimension_numbers"], eqn.params
    taps = 1
    for a, (ld, rd, od) in enumerate(zip(dn.lhs_spec[2:], dn.rhs_spec[2:], dn.out_spec[2:])):
        taps *= _valid_taps(
            lhs.shape[ld],
            rhs.shape[rd],
            out.shape[od],
            prm["window_strides"][a],
            prm["padding"][a][0],
            prm["lhs_dilation"][a],
            prm["rhs_dilation"][a],
        )
    batch, cout, cin_per_group = out.shape[dn.out_spec[0]], out.shape[dn.out_spec[1]], rhs.shape[dn.rhs_spec[1]]
    return float(batch * cout * cin_per_group * taps)


def _dot_macs(eqn) -> float:
    lhs, rhs = (v.aval for v in eqn.invars[:2])
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    contract = math.prod(lhs.shape[d] for d in lc)
    return float(math.prod(eqn.outvars[0].aval.shape)) * contract


def _walk(jaxpr, groups: dict, flops: dict[str, float], last: list[str | None], seen: list[str]) -> None:
    """Charge 2 x MACs of every product in ``jaxpr`` to a parameter group (module doc); ``seen``
    collects the groups in the order their parameters are first read (the forward order)."""
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if not _is_literal(v) and v in groups and groups[v] not in seen:
                seen.append(groups[v])
        subs = [p for p in eqn.params.values() if hasattr(p, "jaxpr") or hasattr(p, "eqns")]
        if subs and eqn.primitive.name in ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "remat"):
            inner = subs[0].jaxpr if hasattr(subs[0], "jaxpr") else subs[0]
            inner_groups = {
                iv: groups[ov] for ov, iv in zip(eqn.invars, inner.invars) if not _is_literal(ov) and ov in groups
            }
            _walk(inner, inner_groups, flops, last, seen)
            continue
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            macs = _dot_macs(eqn) if eqn.primitive.name == "dot_general" else _conv_macs(eqn)
            owner = next((groups[v] for v in eqn.invars if not _is_literal(v) and v in groups), None)
            owner = owner or last[0]
            if owner is None:
                owner = "(input)"
            last[0] = owner
            flops[owner] = flops.get(owner, 0.0) + 2.0 * macs
            continue
        if eqn.primitive.name in _PASS_THROUGH or eqn.primitive.name.startswith("convert"):
            src = [groups[v] for v in eqn.invars if not _is_literal(v) and v in groups]
            if len(set(src)) == 1:
                for o in eqn.outvars:
                    groups[o] = src[0]


def _is_literal(v) -> bool:
    return not hasattr(v, "count") and hasattr(v, "val")


def from_apply(
    name: str, forward: Callable[[Any, Any], Any], params: Mapping[str, Any], x: Any, batch: int, source: str = ""
) -> Profile:
    """Profile of ``forward(params, x)`` (``params`` a dict whose top-level keys are the layers, in
    forward order; ``x`` a batch of ``batch`` samples, arrays or ``jax.ShapeDtypeStruct``) from
    its jaxpr: see the module docstring.  Nothing is computed."""
    import jax

    if not isinstance(params, Mapping) or not params:
        raise ValueError(f"profile {name!r}: params must be a non-empty dict of layers")
    closed = jax.make_jaxpr(forward)(params, x)
    # make_jaxpr flattens (params, x) in pytree order (dict keys sorted)
    order = [k for k in sorted(params) for _ in jax.tree.leaves(params[k])]
    groups = {v: order[i] for i, v in enumerate(closed.jaxpr.invars[: len(order)])}
    flops: dict[str, float] = {}
    seen: list[str] = []
    _walk(closed.jaxpr, groups, flops, [None], seen)
    seen += [k for k in params if k not in seen]  # parameters the forward pass never reads
    fwd = []
    for k in seen:
        size = sum(math.prod(getattr(leaf, "shape", ())) for leaf in jax.tree.leaves(params[k]))
        shapes = tuple(tuple(getattr(leaf, "shape", ())) or (1,) for leaf in jax.tree.leaves(params[k]))
        fwd.append((str(k), flops.pop(k, 0.0), size, shapes))
    if flops.get("(input)", 0.0) > 0:
        fwd[0] = (fwd[0][0], fwd[0][1] + flops.pop("(input)"), *fwd[0][2:])
    return _backprop(name, fwd, batch, source or f"derived from the jaxpr of {name}'s forward pass")


def from_model(
    model: str, input_shape: Sequence[int], num_classes: int, batch: int, dtype: Any = None, **hparams
) -> Profile:
    """Profile of a registered cconv model (``cconv.models``) at local batch ``batch``, built
    abstractly (``nnx.eval_shape``: no initialisation is computed); inputs ``float32`` (``int32``
    tokens for the transformer when ``dtype`` is not given)."""
    return from_spec(
        model, abstract_spec(model, input_shape, num_classes, **hparams), _input(model, input_shape, batch, dtype)
    )


def abstract_spec(model: str, input_shape: Sequence[int], num_classes: int, **hparams) -> Any:
    """The ``ModelSpec`` of ``cconv.models.build`` with shape-only parameters (``cconv.models.abstract``)."""
    from cconv import models

    return models.abstract(model, input_shape, num_classes, **hparams)


def _input(model: str, input_shape: Sequence[int], batch: int, dtype: Any) -> Any:
    import jax
    import jax.numpy as jnp

    from cconv import models

    dtype = models.input_dtype(model) if dtype is None else dtype
    return jax.ShapeDtypeStruct((int(batch), *(int(s) for s in input_shape)), jnp.dtype(dtype))


def from_spec(name: str, spec: Any, x: Any) -> Profile:
    """Profile of a ``cconv.models.ModelSpec`` on the batch ``x`` (its leading axis is the batch)."""
    import jax
    import jax.numpy as jnp

    # shape-only model state (``abstract_spec``: BatchNorm statistics) as zeros: it is small
    state = jax.tree.map(
        lambda v: jnp.zeros(v.shape, v.dtype) if isinstance(v, jax.ShapeDtypeStruct) else v, spec.model_state
    )

    def forward(params, xb):
        return spec.apply(params, state, xb, True, None)[0]

    return from_apply(name, forward, spec.params, x, int(x.shape[0]), f"derived from the jaxpr of {name}")


__all__ = [
    "Layer",
    "Profile",
    "layer",
    "make",
    "scaled",
    "resnet50",
    "bert",
    "names",
    "get",
    "from_apply",
    "from_model",
    "from_spec",
    "abstract_spec",
    "FLOAT_BYTES",
]
