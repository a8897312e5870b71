"""The FSDP2 lines that load a converted DCP checkpoint, printed after the write.

dcp.load fills a state dict in place, so the template must have the saved
nesting: the model and optimizer state dicts FSDP2 produces
(get_model_state_dict / get_optimizer_state_dict, sharded DTensors), placed at
the paths they were written under.
"""

import json

from migrate_fsdp.convert_ckpt.layout import ACCELERATE_EXTRAS, DCP, Plan


def _key(key) -> str:
    return json.dumps(key) if isinstance(key, str) else repr(key)


def _nest(path: tuple, expression: str) -> str:
    for key in reversed(path):
        expression = f"{{{_key(key)}: {expression}}}"
    return expression


def _compose(model_path, optim_path) -> str:
    """A dict expression placing model_state and optim_state at their paths."""
    if model_path == ():
        if optim_path is None:
            return "model_state"
        return f"{{**model_state, {_key(optim_path[0])}: {_nest(optim_path[1:], 'optim_state')}}}"
    if optim_path == ():
        return "optim_state"
    entries = {}
    for path, name in ((model_path, "model_state"), (optim_path, "optim_state")):
        if path is not None:
            entries.setdefault(path[0], []).append((path[1:], name))
    rendered = []
    for key, values in entries.items():
        if len(values) == 1:
            rendered.append(f"{_key(key)}: {_nest(*values[0])}")
        else:  # both under one top-level key: {"ckpt": {"model": ..., "optim": ...}}
            inner = ", ".join(f"{_key(p[0])}: {_nest(p[1:], n)}" for p, n in values)
            rendered.append(f"{_key(key)}: {{{inner}}}")
    return "{" + ", ".join(rendered) + "}"


def loading_snippet(plan: Plan, dst: str, torchtitan: bool) -> str | None:
    """None when there is nothing to show: no DCP output, or no model or optimizer found to load into."""
    dcp_outputs = [o for o in plan.outputs if o.kind == DCP]
    has_model, has_optim = plan.model_path is not None, plan.optim_path is not None
    if not dcp_outputs or not (has_model or has_optim):
        return None
    options = ", options=StateDictOptions(flatten_optimizer_state_dict=True)" if torchtitan else ""
    names = (
        (["get_model_state_dict", "set_model_state_dict"] if has_model else [])
        + (["get_optimizer_state_dict", "set_optimizer_state_dict"] if has_optim else [])
        + (["StateDictOptions"] if options and has_optim else [])
    )
    lines = [
        "# Load in FSDP2, on every rank, after fully_shard(...) and creating the optimizer:",
        "import torch.distributed.checkpoint as dcp",
        f"from torch.distributed.checkpoint.state_dict import {', '.join(names)}",
    ]
    if has_model:
        lines.append("model_state = get_model_state_dict(model)")
    if has_optim:
        lines.append(f"optim_state = get_optimizer_state_dict(model, optimizer{options})")
    if len(dcp_outputs) == 1:
        state = _compose(plan.model_path, plan.optim_path)
        if state.endswith("_state"):
            lines.append(f"dcp.load({state}, checkpoint_id={_key(dst)})")
        else:
            lines.append(f"state = {state}")
            lines.append(f"dcp.load(state, checkpoint_id={_key(dst)})")
    else:
        for output, (path, name) in zip(
            dcp_outputs, ((plan.model_path, "model_state"), (plan.optim_path, "optim_state"))
        ):
            lines.append(f"dcp.load({_nest(path, name)}, checkpoint_id={_key(dst + '/' + output.name)})")
    if has_model:
        lines.append("set_model_state_dict(model, model_state)")
    if has_optim:
        lines.append(f"set_optimizer_state_dict(model, optimizer, optim_state{options})")
    extras = ", ".join(map(str, plan.extras))
    if plan.extras and len(dcp_outputs) == 1:
        lines.append(
            f"# also saved: {extras}; to restore them, add them to `state` (a value of the same type, "
            "a tensor of the same shape) before dcp.load"
        )
    elif plan.extras:
        lines.append(
            f"# {extras}: in {dst}/{ACCELERATE_EXTRAS}, torch.load(path, weights_only=True) (argparse.Namespace, "
            "numpy or pathlib values need torch.serialization.safe_globals)"
        )
    return "\n".join(lines)
