"""`--check-against pkg.module:factory`: the FSDP2 model's keys and shapes, checked before anything is written.

The factory builds the model under `torch.device("meta")`, so even a huge
model costs no memory; FSDP2's state dict keys are the plain module's
(fully_shard does not rename parameters), so the unsharded module is what to
return.
"""

import importlib
import importlib.util
import os
import sys

from migrate_fsdp.convert_ckpt.errors import ConvertError
from migrate_fsdp.convert_ckpt.structure import STATE
from migrate_fsdp.convert_ckpt.tensors import TensorRef


def load_factory(spec: str):
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConvertError(f"--check-against {spec!r}: expected MODULE:FACTORY or path/to/file.py:FACTORY")
    try:
        if module_name.endswith(".py"):
            location = importlib.util.spec_from_file_location("_migrate_fsdp_model_factory", module_name)
            if location is None or not os.path.isfile(module_name):
                raise ImportError(f"no file {module_name}")
            module = importlib.util.module_from_spec(location)
            location.loader.exec_module(module)
        else:
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
        return getattr(module, attr)
    except Exception as error:  # the user's module may fail in any way; report it in one line
        raise ConvertError(f"--check-against {spec}: cannot load: {type(error).__name__}: {error}") from None


def check_against(spec: str, model: dict | None, optimizer: dict | None) -> list[str]:
    """Every missing, unexpected or mis-shaped key of the converted checkpoint against the factory's model."""
    import torch

    factory = load_factory(spec)
    try:
        with torch.device("meta"):
            module = factory()
    except Exception as error:
        raise ConvertError(f"--check-against {spec}: the factory failed: {type(error).__name__}: {error}") from None
    if not isinstance(module, torch.nn.Module):
        raise ConvertError(f"--check-against {spec}: the factory returned a {type(module).__name__}, not an nn.Module")
    expected = {
        key: tuple(value.shape) for key, value in module.state_dict().items() if isinstance(value, torch.Tensor)
    }
    model = model or {}
    problems = [f"missing: {key} (the model has it, the checkpoint does not)" for key in expected if key not in model]
    problems += [f"unexpected: {key} (in the checkpoint, not in the model)" for key in model if key not in expected]
    for key, shape in expected.items():
        value = model.get(key)
        if isinstance(value, TensorRef) and value.shape != shape:
            problems.append(f"shape: {key} is {list(value.shape)} in the checkpoint, {list(shape)} in the model")
    parameters = {name for name, _ in module.named_parameters()}
    for key in (optimizer or {}).get(STATE, {}):
        if key not in parameters:
            problems.append(f"unexpected: optimizer state for {key} (not a parameter of the model)")
    return problems
