"""Complex-valued tensors of a traced program computed as real ``(..., 2)`` pairs (an FX rewrite, stage 3).

Pattern: complex rotary embeddings (DeepSeek-V2, Llama 4: ``freqs_cis = torch.polar(ones, freqs)``, then
``view_as_complex(q) * freqs_cis`` and ``view_as_real``), Fourier token mixing (FNet: ``torch.fft.fftn(x).real``),
autocorrelation (Autoformer: ``irfft(rfft(q) * conj(rfft(k)))``) and inverse-STFT heads (``torch.polar(magnitude,
phase)`` then ``torch.fft.irfft``). Neither ExecuTorch nor torchlib runs complex tensors: ``aten.polar`` and the
FFTs are not Core ATen (ExecuTorch's edge verifier refuses them) and torchlib has no complex ``aten.unsqueeze``.
Every complex value is the pair (real, imaginary) in a trailing dim of 2, which is what ``view_as_real`` returns, so
the rewrite maps each complex node to the real node of its pair: views shift their dims past the pair dim, products
expand to ``(ac - bd, ad + bc)``, and a discrete Fourier transform along a dim of size ``N`` is two real matmuls
with the ``N x N`` cosine and sine matrices (built in the graph from ``arange(N)``, so ``N`` stays symbolic). The
rewrite is all or nothing: a graph with a complex op it does not know, or a complex output, is left as it is (and
fails as before, naming the op).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import torch

aten = torch.ops.aten

_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float16}


def _is_complex(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_complex()


class _Emitter:
    """New nodes before ``anchor`` (its meta, their own fake ``val``: :func:`engine.patches.fx_edit.insert_node`), without
    the anchor's ``tensor_meta``, which describes another tensor: ``self(target, *args)``."""

    def __init__(self, gm: torch.fx.GraphModule, anchor: torch.fx.Node):
        self.gm, self.anchor = gm, anchor

    def __call__(self, target, *args, **kwargs) -> torch.fx.Node:
        from engine.patches.fx_edit import insert_node

        new = insert_node(self.gm, self.anchor, target, *args, **kwargs)
        new.meta.pop("tensor_meta", None)
        return new

    # pairs ---------------------------------------------------------------------------------------------------
    def parts(self, pair: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node]:
        return self(aten.select.int, pair, -1, 0), self(aten.select.int, pair, -1, 1)

    def pair(self, real: torch.fx.Node, imag: torch.fx.Node) -> torch.fx.Node:
        return self(aten.stack.default, [real, imag], -1)

    def size(self, node: torch.fx.Node, dim: int) -> torch.fx.Node | int:
        size = node.meta["val"].shape[dim]
        return size if isinstance(size, int) else self(aten.sym_size.int, node, dim % node.meta["val"].dim())

    # the Fourier matrices ------------------------------------------------------------------------------------
    def angles(self, rows, columns, period, dtype) -> torch.fx.Node:
        """``2 pi (j k mod period) / period`` for ``j < rows``, ``k < columns`` (the product reduced exactly in
        integers first, so large sizes keep their precision)."""
        j = self(aten.arange.default, rows, dtype=torch.int64)
        k = self(aten.arange.default, columns, dtype=torch.int64)
        products = self(aten.mul.Tensor, self(aten.unsqueeze.default, j, 1), self(aten.unsqueeze.default, k, 0))
        period_tensor = self(aten.sum.default, self(aten.ones_like.default, self(aten.arange.default, period,
                                                                                   dtype=torch.int64)))
        reduced = self(aten.remainder.Tensor, products, period_tensor)
        turns = self(aten.div.Tensor, self(aten._to_copy.default, reduced, dtype=dtype),
                     self(aten._to_copy.default, period_tensor, dtype=dtype))
        return self(aten.mul.Tensor, turns, 2 * math.pi)

    def along(self, x: torch.fx.Node, dim: int, matrix: torch.fx.Node) -> torch.fx.Node:
        """``x`` contracted with ``matrix`` (``(size of dim, new size)``) along ``dim``."""
        moved = self(aten.movedim.int, x, dim, -1)
        return self(aten.movedim.int, self(aten.matmul.default, moved, matrix), -1, dim)

    def scale(self, x: torch.fx.Node, norm: str | None, inverse: bool, size, dtype) -> torch.fx.Node:
        if norm == "ortho" or (norm in (None, "backward")) == inverse:
            n = self(aten._to_copy.default, self(aten.sum.default, self(aten.ones_like.default, self(
                aten.arange.default, size, dtype=torch.int64))), dtype=dtype)
            divisor = self(aten.sqrt.default, n) if norm == "ortho" else n
            return self(aten.div.Tensor, x, divisor)
        return x

    def dft(self, real, imag, dim: int, inverse: bool, norm: str | None, dtype):
        """The (inverse) DFT of ``real + i imag`` along ``dim`` (``imag`` may be None: a real input)."""
        n = self.size(real, dim)
        theta = self.angles(n, n, n, dtype)
        cos, sin = self(aten.cos.default, theta), self(aten.sin.default, theta)
        sign = 1 if inverse else -1  # e^{sign i theta} = cos + sign i sin
        out_real = self.along(real, dim, cos)
        out_imag = self(aten.mul.Tensor, self.along(real, dim, sin), sign)
        if imag is not None:
            out_real = self(aten.sub.Tensor, out_real, self(aten.mul.Tensor, self.along(imag, dim, sin), sign))
            out_imag = self(aten.add.Tensor, out_imag, self.along(imag, dim, cos))
        return (self.scale(out_real, norm, inverse, n, dtype), self.scale(out_imag, norm, inverse, n, dtype))


def _dim(dim: int) -> int:
    """A complex tensor's dim in its pair, which has one trailing dim more: negative dims count past it (also for
    ``unsqueeze``, whose dim counts the new one)."""
    return dim if dim >= 0 else dim - 1


# Each rule: (emitter, node, pair_of) -> the node's pair (a complex result) or real node (a real result), or None
# when the rule does not apply to these arguments (the whole rewrite is then abandoned).
_Rule = Callable[[_Emitter, torch.fx.Node, Callable[[torch.fx.Node], torch.fx.Node]], "torch.fx.Node | None"]


def _polar(e, node, pair_of):
    magnitude, angle = node.args
    return e.pair(e(aten.mul.Tensor, magnitude, e(aten.cos.default, angle)),
                  e(aten.mul.Tensor, magnitude, e(aten.sin.default, angle)))


def _view_as_complex(e, node, pair_of):
    return node.args[0]


def _view_as_real(e, node, pair_of):
    return pair_of(node.args[0])


def _conversion(e, node, pair_of):
    """``to``/``_to_copy`` (device moves and dtype casts) into, out of or between complex dtypes."""
    source = node.args[0]
    dtype = node.kwargs.get("dtype", next((a for a in node.args[1:] if isinstance(a, torch.dtype)), None))
    out = node.meta["val"]
    if not _is_complex(out):  # complex to real keeps the real part, as torch does (with a warning)
        return e(aten._to_copy.default, e.parts(pair_of(source))[0], dtype=out.dtype) if dtype is not None else None
    real_dtype = _REAL_OF[out.dtype]
    if _is_complex(source.meta["val"]):
        return e(aten._to_copy.default, pair_of(source), dtype=real_dtype)
    real = e(aten._to_copy.default, source, dtype=real_dtype)
    return e.pair(real, e(aten.zeros_like.default, real))


def _product(e, node, pair_of):
    a, b = node.args[:2]
    if len(node.args) > 2 or node.kwargs:
        return None
    if not (isinstance(a, torch.fx.Node) and _is_complex(a.meta["val"])):
        a, b = b, a
    if isinstance(b, torch.fx.Node) and _is_complex(b.meta["val"]):
        (ar, ai), (br, bi) = e.parts(pair_of(a)), e.parts(pair_of(b))
        return e.pair(e(aten.sub.Tensor, e(aten.mul.Tensor, ar, br), e(aten.mul.Tensor, ai, bi)),
                      e(aten.add.Tensor, e(aten.mul.Tensor, ar, bi), e(aten.mul.Tensor, ai, br)))
    if isinstance(b, torch.fx.Node):  # a real tensor scales both parts
        return e(aten.mul.Tensor, pair_of(a), e(aten.unsqueeze.default, b, -1))
    if isinstance(b, (int, float)):
        return e(aten.mul.Tensor, pair_of(a), b)
    return None


def _sum_or_difference(e, node, pair_of):
    a, b = node.args[:2]
    complex_args = [isinstance(x, torch.fx.Node) and _is_complex(x.meta["val"]) for x in (a, b)]
    if len(node.args) > 2 or node.kwargs.get("alpha", 1) != 1 or not all(complex_args):
        return None
    return e(node.target, pair_of(a), pair_of(b))


def _same_op(e, node, pair_of):
    """Ops that act on each element alike (copies): the same op on the pair."""
    return e(node.target, pair_of(node.args[0]), *node.args[1:], **node.kwargs)


def _with_dim(e, node, pair_of):
    """Ops whose second argument is a dim (``unsqueeze``, ``squeeze``, ``select``, ``slice``)."""
    args = [pair_of(node.args[0]), *node.args[1:]]
    if len(args) > 1:
        args[1] = _dim(args[1])
    return e(node.target, *args, **node.kwargs)


def _with_shape(e, node, pair_of):
    return e(node.target, pair_of(node.args[0]), [*node.args[1], 2], *node.args[2:], **node.kwargs)


def _permute(e, node, pair_of):
    rank = node.args[0].meta["val"].dim()
    return e(node.target, pair_of(node.args[0]), [d % rank for d in node.args[1]] + [rank])


def _transpose(e, node, pair_of):
    rank = node.args[0].meta["val"].dim()
    return e(node.target, pair_of(node.args[0]), node.args[1] % rank, node.args[2] % rank)


def _cat(e, node, pair_of):
    tensors = node.args[0]
    if not all(_is_complex(t.meta["val"]) for t in tensors):
        return None
    rank = tensors[0].meta["val"].dim()
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    return e(node.target, [pair_of(t) for t in tensors], dim % rank)


def _part(index: int):
    def rule(e, node, pair_of):
        return e(aten.select.int, pair_of(node.args[0]), -1, index)
    return rule


def _fourier(inverse: bool, many: bool):
    """``torch.fft.fft``/``ifft`` (one dim) and ``fftn``/``ifftn`` (``dim=`` dims) without resizing (``n``/``s``)."""
    def rule(e, node, pair_of):
        bound = node.normalized_arguments(e.gm, normalize_to_only_use_kwargs=True).kwargs  # by name, defaults filled
        x = bound["input"]
        value = x.meta["val"]
        if bound.get("s" if many else "n") is not None:
            return None
        rank = value.dim()
        dims = bound.get("dim") if many else [bound.get("dim", -1)]
        dims = list(range(rank)) if dims is None else [d % rank for d in dims]
        dtype = _REAL_OF[node.meta["val"].dtype]
        if _is_complex(value):
            real, imag = e.parts(pair_of(x))
        else:
            real, imag = e(aten._to_copy.default, x, dtype=dtype), None
        for dim in dims:
            real, imag = e.dft(real, imag, dim, inverse, bound.get("norm"), dtype)
        return e.pair(real, imag)
    return rule


def _real_fourier(e, node, pair_of):
    """``torch.fft.rfft`` of ``N`` real samples: the ``N // 2 + 1`` non-negative frequency bins, the DFT's first
    columns (``n`` only where it is the input's size: no padding or cropping)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    bound = node.normalized_arguments(e.gm, normalize_to_only_use_kwargs=True).kwargs
    x, norm = bound["input"], bound.get("norm")
    value = x.meta["val"]
    dim = bound.get("dim", -1) % value.dim()
    n = bound.get("n")
    n = n.meta["val"] if isinstance(n, torch.fx.Node) else n
    if n is not None and not statically_known_true(n == value.shape[dim]):
        return None
    dtype = _REAL_OF[node.meta["val"].dtype]
    real = e(aten._to_copy.default, x, dtype=dtype)
    length = e.size(real, dim)
    bins = e(operator.add, e(operator.floordiv, length, 2), 1) if isinstance(length, torch.fx.Node) else length // 2 + 1
    theta = e.angles(length, bins, length, dtype)
    out_real = e.along(real, dim, e(aten.cos.default, theta))
    out_imag = e(aten.mul.Tensor, e.along(real, dim, e(aten.sin.default, theta)), -1)  # e^{-i theta}
    return e.pair(e.scale(out_real, norm, False, length, dtype), e.scale(out_imag, norm, False, length, dtype))


def _conjugate(e, node, pair_of):
    """``torch.conj``: the imaginary part negated."""
    real, imag = e.parts(pair_of(node.args[0]))
    return e.pair(real, e(aten.neg.default, imag))


def _inverse_real_fourier(e, node, pair_of):
    """``torch.fft.irfft`` of the ``M`` non-negative frequency bins to ``2 (M - 1)`` real samples: each bin but the
    first and the last stands for itself and its conjugate (weight 2); imaginary parts of those two are ignored."""
    bound = node.normalized_arguments(e.gm, normalize_to_only_use_kwargs=True).kwargs
    x, norm = bound["input"], bound.get("norm")
    value = x.meta["val"]
    rank = value.dim()
    dim = bound.get("dim", -1) % rank
    bins = value.shape[dim]
    if bound.get("n") is not None and not (isinstance(bins, int) and bound["n"] == 2 * (bins - 1)):
        return None
    dtype = _REAL_OF[value.dtype]
    real, imag = e.parts(pair_of(x))
    m = e.size(real, dim)
    length = e(operator.mul, e(operator.sub, m, 1), 2) if isinstance(m, torch.fx.Node) else 2 * (m - 1)
    theta = e.angles(m, length, length, dtype)
    k = e(aten.arange.default, m, dtype=torch.int64)
    last = e(aten.sub.Tensor, e(aten.sum.default, e(aten.ones_like.default, k)), 1)
    ends = e(aten.logical_or.default, e(aten.eq.Scalar, k, 0), e(aten.eq.Tensor, k, last))
    weight = e(aten.add.Tensor, e(aten.mul.Tensor, e(aten._to_copy.default, ends, dtype=dtype), -1.0), 2.0)  # 1 or 2
    weight = e(aten.unsqueeze.default, weight, 1)
    cos = e(aten.mul.Tensor, e(aten.cos.default, theta), weight)
    sin = e(aten.mul.Tensor, e(aten.sin.default, theta), weight)
    samples = e(aten.sub.Tensor, e.along(real, dim, cos), e.along(imag, dim, sin))
    return e.scale(samples, norm, True, length, dtype)


def _dropped(e, node, pair_of):
    """A metadata assertion on a complex tensor (its dtype): the pair is another dtype, and nothing reads it."""
    return _DROP


_DROP = object()

RULES: dict = {
    aten.polar.default: _polar,
    aten.view_as_complex.default: _view_as_complex,
    aten.view_as_real.default: _view_as_real,
    aten.to.dtype_layout: _conversion,
    aten.to.dtype: _conversion,
    aten.to.device: _conversion,
    aten._to_copy.default: _conversion,
    aten.mul.Tensor: _product,
    aten.add.Tensor: _sum_or_difference,
    aten.sub.Tensor: _sum_or_difference,
    aten.clone.default: _same_op,
    aten.contiguous.default: _same_op,
    aten.alias.default: _same_op,
    aten.unsqueeze.default: _with_dim,
    aten.squeeze.dim: _with_dim,
    aten.slice.Tensor: _with_dim,
    aten.select.int: _with_dim,
    aten.view.default: _with_shape,
    aten.reshape.default: _with_shape,
    aten._unsafe_view.default: _with_shape,
    aten.expand.default: _with_shape,
    aten.permute.default: _permute,
    aten.transpose.int: _transpose,
    aten.cat.default: _cat,
    aten.real.default: _part(0),
    aten.imag.default: _part(1),
    aten.fft_fft.default: _fourier(inverse=False, many=False),
    aten.fft_ifft.default: _fourier(inverse=True, many=False),
    aten.fft_fftn.default: _fourier(inverse=False, many=True),
    aten.fft_ifftn.default: _fourier(inverse=True, many=True),
    aten.fft_irfft.default: _inverse_real_fourier,
    aten.fft_rfft.default: _real_fourier,
    aten._conj.default: _conjugate,
    aten.conj_physical.default: _conjugate,
    aten._assert_tensor_metadata.default: _dropped,
}


def touches_complex(node: torch.fx.Node) -> bool:
    values = node.meta.get("val")
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    return any(_is_complex(v) for v in values) or any(_is_complex(a.meta.get("val")) for a in node.all_input_nodes)


def complex_as_real_pairs(gm: torch.fx.GraphModule) -> int:
    """Rewrite every complex-valued node of ``gm`` (see the module docstring); returns how many nodes were
    rewritten, 0 when the graph has none or has one this rewrite does not know (the graph is then unchanged)."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and touches_complex(n)]
    if not nodes:
        return 0
    if any(n.op in ("placeholder", "output") and touches_complex(n) for n in gm.graph.nodes if n.op != "call_function"):
        return 0
    if any(n.target not in RULES for n in nodes):
        return 0
    pairs: dict[torch.fx.Node, torch.fx.Node] = {}
    new_nodes: list[torch.fx.Node] = []
    results: dict[torch.fx.Node, object] = {}
    for node in nodes:
        emitter = _Emitter(gm, node)
        before = set(gm.graph.nodes)
        result = RULES[node.target](emitter, node, pairs.__getitem__)
        new_nodes += [n for n in gm.graph.nodes if n not in before]
        if result is None:  # not these arguments: undo everything
            for n in reversed(new_nodes):
                gm.graph.erase_node(n)
            return 0
        results[node] = result
        if _is_complex(node.meta.get("val")):
            pairs[node] = result
    for node in reversed(nodes):
        result = results[node]
        if result is not _DROP and not _is_complex(node.meta.get("val")):
            node.replace_all_uses_with(result)
    for node in reversed(nodes):
        gm.graph.erase_node(node)
    return len(nodes)
