"""Rules for what training and checkpoint code does with a wrapped model (MF2xx), in code order."""

from migrate_fsdp.rewrite.rules.training.activation_checkpointing import ActivationCheckpointing
from migrate_fsdp.rewrite.rules.training.clip_grad_norm import ClipGradNorm
from migrate_fsdp.rewrite.rules.training.flat_param_internals import FlatParamInternals
from migrate_fsdp.rewrite.rules.training.fsdp_modules import FsdpModules
from migrate_fsdp.rewrite.rules.training.fsdp_subclass import FsdpSubclass
from migrate_fsdp.rewrite.rules.training.isinstance_fsdp import IsinstanceFsdp
from migrate_fsdp.rewrite.rules.training.no_sync import NoSync
from migrate_fsdp.rewrite.rules.training.optim_state_dict import OptimStateDict
from migrate_fsdp.rewrite.rules.training.sharded_grad_scaler import ShardedGradScaler
from migrate_fsdp.rewrite.rules.training.state_dict_type import StateDictType
from migrate_fsdp.rewrite.rules.training.summon_full_params import SummonFullParams
from migrate_fsdp.rewrite.rules.training.wrapped_prefix_strings import WrappedPrefixStrings
from migrate_fsdp.rewrite.rules.training.wrapper_attributes import WrapperAttributes

TRAINING_RULES: list = [
    NoSync,
    StateDictType,
    OptimStateDict,
    SummonFullParams,
    ClipGradNorm,
    IsinstanceFsdp,
    FsdpModules,
    ShardedGradScaler,
    WrapperAttributes,
    FsdpSubclass,
    FlatParamInternals,
    WrappedPrefixStrings,
    ActivationCheckpointing,
]
