"""The node fixes' kit: new nodes carry the fake values later passes read; sizes become nodes of the input dims."""

import sympy
import torch

from engine.patches.fx_edit import fake_value, insert_node, replace_node, size_node


class _Scaled(torch.nn.Module):
    def forward(self, x, y):
        return torch.cat([x, y]).relu() * 2


def _program():
    x, y = torch.randn(3, 4), torch.randn(5, 4)
    dims = {"x": {0: torch.export.Dim.AUTO}, "y": {0: torch.export.Dim.AUTO}}
    return torch.export.export(_Scaled(), (x, y), dynamic_shapes=dims), (x, y)


def test_an_inserted_node_carries_its_fake_value_and_a_replacement_computes_as_the_original():
    program, (x, y) = _program()
    gm = program.graph_module
    relu = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.relu.default)
    clamped = insert_node(gm, relu, torch.ops.aten.clamp_min.default, relu.args[0], 0.0)
    assert tuple(clamped.meta["val"].shape) == tuple(relu.meta["val"].shape)  # symbolic (s0 + s1, 4)
    assert fake_value([relu.args[0], 3]) == [relu.args[0].meta["val"], 3]
    assert replace_node(gm, relu, torch.ops.aten.clamp_min.default, (relu.args[0], 0.0), {})
    gm.graph.eliminate_dead_code()
    gm.recompile()
    assert not any(n.target == torch.ops.aten.relu.default for n in gm.graph.nodes)
    torch.testing.assert_close(program.module()(x, y), _Scaled()(x, y), rtol=0, atol=0)


def test_a_size_expression_becomes_nodes_of_the_input_dims():
    program, (x, y) = _program()
    gm = program.graph_module
    cat = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.cat.default)
    rows = cat.meta["val"].shape[0]  # s0 + s1
    node = size_node(gm, cat, rows.node.expr * 2)
    assert isinstance(node, torch.fx.Node) and node.meta["val"].node.expr == (rows * 2).node.expr
    assert size_node(gm, cat, sympy.Integer(7)) == 7
    assert size_node(gm, cat, sympy.Symbol("u0") + 1) is None  # not an input dim: no node to read it from
