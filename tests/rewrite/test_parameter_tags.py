"""Which programs set attributes of their own on parameters (FSDP1 with use_orig_params kept them; fully_shard's new
parameters get them back only where the program sets some)."""

import pytest

from migrate_fsdp.rewrite.analysis.parameter_tags import tags_parameters


@pytest.mark.parametrize(
    "source",
    [
        "for p in norm.parameters():\n    p._no_weight_decay = True\n",
        "for name, param in model.named_parameters():\n    param.is_embedding = 'embed' in name\n",
        "m.weight.model_parallel = True\nm.bias.model_parallel = True\n",
        "for p in block.parameters():\n    setattr(p, 'expert', True)\n",
    ],
)
def test_attributes_set_on_parameters_are_tags(source):
    assert tags_parameters(source.encode())


@pytest.mark.parametrize(
    "source",
    [
        "for p in model.parameters():\n    p.requires_grad = False\n",
        "for p in model.parameters():\n    p.grad = None\n    p.data = p.data.half()\n",
        "m.weight.requires_grad = False\nif m.weight.shape == (2, 2):\n    pass\n",
        "for p in model.parameters():\n    total += p.numel()\nother.attribute = 1\n",
    ],
)
def test_tensor_attributes_and_other_objects_are_not(source):
    assert not tags_parameters(source.encode())
