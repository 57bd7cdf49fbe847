"""Attribute swaps restore the class hierarchy exactly; dotted paths resolve to their owner."""

from engine.swap import resolve_dotted_path, swap_attributes


def test_inherited_attribute_is_deleted_not_shadowed():
    class Base:
        def f(self):
            return "base"

    class Child(Base):
        pass

    with swap_attributes([(Child, "f", lambda self: "patched")]):
        assert Child().f() == "patched"
    assert "f" not in vars(Child) and Child().f() == "base"


def test_a_dotted_path_resolves_to_its_owner_and_attribute():
    import torch.nn.functional as F

    owner, attr = resolve_dotted_path("torch.nn.functional.scaled_dot_product_attention")
    assert owner is F and attr == "scaled_dot_product_attention"
