"""Leaf-by-leaf comparison of an artifact's outputs with eager outputs.

Both sides are ``{leaf name: tensor}`` (see :func:`engine.get_leaf_tensors`). A leaf passes when
``|got - ref| <= atol + rtol * |ref|`` element-wise (``torch.allclose`` semantics); a missing or extra leaf,
a shape or a dtype-kind mismatch fails it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LeafDiff:
    name: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    ok: bool = True
    problem: str = ""  # "missing", "unexpected", "shape (2, 3) != (2, 4)", "nan mismatch", ...

    def __str__(self) -> str:
        if self.problem:
            return f"{self.name}: {self.problem}"
        return f"{self.name}: max abs diff {self.max_abs:.3g}, max rel diff {self.max_rel:.3g}"


@dataclass
class Comparison:
    leaves: list[LeafDiff] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.leaves)

    @property
    def failures(self) -> list[LeafDiff]:
        return [d for d in self.leaves if not d.ok]

    def __str__(self) -> str:
        bad = self.failures
        if not bad:
            return f"all {len(self.leaves)} leaves match"
        return f"{len(bad)} of {len(self.leaves)} leaves differ: " + "; ".join(map(str, bad))


def compare_leaves(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor], *, atol: float = 1e-4, rtol: float = 1e-4) -> Comparison:
    out = Comparison()
    for name in ref:
        if name not in got:
            out.leaves.append(LeafDiff(name, ok=False, problem="missing from the artifact's outputs"))
            continue
        out.leaves.append(_compare_one(name, ref[name], got[name], atol, rtol))
    for name in got:
        if name not in ref:
            out.leaves.append(LeafDiff(name, ok=False, problem="not among the eager outputs"))
    return out


def _compare_one(name: str, ref: torch.Tensor, got: torch.Tensor, atol: float, rtol: float) -> LeafDiff:
    got = torch.as_tensor(got)
    if tuple(ref.shape) != tuple(got.shape):
        return LeafDiff(name, ok=False, problem=f"shape {tuple(got.shape)} != eager {tuple(ref.shape)}")
    if ref.numel() == 0:
        return LeafDiff(name)
    if ref.dtype == torch.bool or got.dtype == torch.bool:
        mismatches = int((ref.to(torch.bool) != got.to(torch.bool)).sum())
        return LeafDiff(name, float(mismatches), float(mismatches), mismatches == 0)
    r, g = ref.detach().double().cpu(), got.detach().double().cpu()
    nan_r, nan_g = torch.isnan(r), torch.isnan(g)
    if not torch.equal(nan_r, nan_g):
        return LeafDiff(name, float("nan"), float("nan"), False, "NaN positions differ")
    r, g = r.masked_fill(nan_r, 0), g.masked_fill(nan_g, 0)
    # equal values are exact matches, equal infinities included (inf - inf would be NaN, and fail any tolerance);
    # where eager is infinite only that infinity matches (rtol * inf would take any value)
    diff = (r - g).abs().masked_fill(r == g, 0)
    infinite = torch.isinf(r)
    ok = bool((diff <= atol + rtol * r.abs()).all()) and torch.equal(r[infinite], g[infinite])
    rel = diff / r.abs().clamp_min(1e-12)
    return LeafDiff(name, float(diff.max()), float(rel.max()), ok)
