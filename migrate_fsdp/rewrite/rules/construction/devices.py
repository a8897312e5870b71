"""Where FSDP1 put the module (`device_id`), in the terms FSDP2 needs: a device type and the current device.

FSDP1 moves the module to `device_id`; fully_shard moves it to the mesh's
device type at the *current* device index. So the mesh takes `device_id`'s
type, and when `device_id` names a device the script did not make current,
the rewrite makes it current first (else every rank would land on cuda:0).
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.construction.codegen import expression, statements, string

TORCH_DEVICE = "torch.device"
_CURRENT_DEVICE = ("torch.cuda.current_device", "torch.accelerator.current_device_index")
SET_DEVICE = (
    "torch.cuda.set_device",
    "torch.accelerator.set_device_index",
    "torch.xpu.set_device",
    "torch.npu.set_device",
)


def literal_type(ctx, device) -> str | None:
    """"cpu" / "cuda" when `device` spells its type out: "cuda:1", torch.device("cpu"), torch.cuda.current_device()."""
    if isinstance(device, cst.SimpleString):
        return device.evaluated_value.split(":")[0]
    if isinstance(device, cst.Call):
        if ctx.matches(device.func, *_CURRENT_DEVICE):
            return "cuda" if ctx.matches(device.func, _CURRENT_DEVICE[0]) else None
        if ctx.matches(device.func, TORCH_DEVICE) and device.args and isinstance(device.args[0].value, cst.SimpleString):
            return device.args[0].value.evaluated_value.split(":")[0]
    return None


def device_type(analysis, plan) -> cst.BaseExpression:
    """Where FSDP1 put the module: `device_id`'s device type, else the current accelerator's."""
    anchor = plan.site.node
    device = plan.device
    if device is None:
        return expression(f"{analysis.names.ref(anchor, 'torch.accelerator.current_accelerator')}().type")
    literal = literal_type(analysis.ctx, device)
    if literal is not None:
        return string(literal)
    if _is_device_object(analysis, device):
        return expression("DEVICE.type", DEVICE=device)
    return expression(f"{analysis.names.ref(anchor, TORCH_DEVICE)}(DEVICE).type", DEVICE=device)


def set_current_device(analysis, plan) -> list[cst.BaseStatement]:
    """Statements that make `device_id` the current device, when FSDP2 would otherwise pick another."""
    ctx = analysis.ctx
    device = plan.device
    if isinstance(device, cst.Call) and ctx.matches(device.func, *_CURRENT_DEVICE):
        return []
    if literal_type(ctx, device) == "cpu" or ctx.code(device) in analysis.current_devices:
        return []
    if isinstance(device, (cst.SimpleString, cst.Call)) and _has_no_index(ctx, device):
        return []  # FSDP1 also used the current device
    set_index = analysis.names.ref(plan.site.node, "torch.accelerator.set_device_index")
    if isinstance(device, cst.Integer) or literal_type(ctx, device) is not None:
        return statements(f"{set_index}(DEVICE)", DEVICE=device)
    return statements(
        f"""
        if TYPE != "cpu":
            {set_index}(DEVICE)
        """,
        TYPE=device_type(analysis, plan),
        DEVICE=device,
    )


def _has_no_index(ctx, device) -> bool:
    if isinstance(device, cst.SimpleString):
        return ":" not in device.evaluated_value
    return ctx.matches(device.func, TORCH_DEVICE) and len(device.args) == 1 and isinstance(device.args[0].value, cst.SimpleString) and ":" not in device.args[0].value.evaluated_value


def _is_device_object(analysis, node) -> bool:
    """`node` is a name assigned once from torch.device(...) (or a conditional choice between such)."""
    value, definition = analysis.definitions.follow(node, node)
    if definition is None:
        return False
    choices = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
    return all(isinstance(c, cst.Call) and analysis.ctx.matches(c.func, TORCH_DEVICE) for c in choices)
