"""What the engine does to a file around the rules: imports where the FSDP1 ones were, nothing
imported that is not used, no block left with nothing in it. Whole files in, whole files out."""

import textwrap

import libcst as cst

from migrate_fsdp.rewrite.api import ParsedFile, rewrite_program, rewrite_source
from migrate_fsdp.rewrite.selection import Selection


def rewrite(source: str) -> str:
    result = rewrite_source(textwrap.dedent(source), "m.py")
    cst.parse_module(result.new_source)
    assert rewrite_source(result.new_source, "m.py").new_source == result.new_source, "not a fixed point"
    return result.code


def test_fsdp2_imports_go_into_the_guard_the_fsdp1_imports_were_in():
    assert rewrite(
        """\
        import torch

        try:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        except ImportError:
            FSDP = None

        if torch.__version__ >= "2.0":
            from torch.distributed.fsdp import MixedPrecision


        def wrap(model):
            return FSDP(model, mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))
        """
    ) == textwrap.dedent(
        """\
        import torch

        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError:
            FSDP = None


        def wrap(model):
            return fully_shard(
                model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16)
            )
        """
    )


def test_type_checking_imports_stay_while_string_annotations_use_them():
    """The FSDP1 name the string spells is reported too, as the same name unquoted would be."""
    source = """\
        from typing import TYPE_CHECKING

        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        if TYPE_CHECKING:
            from torch.distributed.fsdp import ShardingStrategy


        def wrap(model, strategy: "ShardingStrategy"):
            return FSDP(model)
        """
    assert rewrite(source) == textwrap.dedent(source).replace(
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP", "from torch.distributed.fsdp import fully_shard"
    ).replace("return FSDP(model)", "return fully_shard(model)").replace(
        "def wrap", "# TODO(migrate-fsdp): MF900 FSDP1 API with no automatic rewrite\ndef wrap"
    )


def test_imports_whose_last_use_went_go_too_with_their_blank_line():
    assert rewrite(
        """\
        import functools

        import torch.nn as nn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy


        def wrap(model):
            policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.TransformerEncoderLayer})
            return FSDP(model, auto_wrap_policy=policy)
        """
    ).startswith("import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n\n\ndef wrap(model):\n")


def test_a_loop_or_branch_left_empty_goes_whole_its_comments_stay():
    assert rewrite(
        """\
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import StateDictType


        def train(module, full, steps):
            model = FSDP(module)
            for _ in range(steps):
                FSDP.set_state_dict_type(model, StateDictType.FULL_STATE_DICT)
            if full:
                # the full one
                FSDP.set_state_dict_type(model, StateDictType.FULL_STATE_DICT)
            print("training", model)
        """
    ) == textwrap.dedent(
        """\
        from torch.distributed.fsdp import fully_shard


        def train(module, full, steps):
            model = fully_shard(module)
            # the full one
            print("training", model)
        """
    )


def test_a_users_own_pass_stays():
    source = """\
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


        def wrap(model, ready):
            if ready:
                pass
            return FSDP(model)
        """
    assert "    if ready:\n        pass\n" in rewrite(source)


def test_comments_of_dropped_names_go_with_them_and_an_added_name_takes_none():
    assert rewrite(
        """\
        from torch.distributed.fsdp import (
            FullyShardedDataParallel as FSDP,
            StateDictType,  # the type
            LocalStateDictConfig,  # flattened params
            # ShardedStateDictConfig, # not used
        )


        def is_wrapped(model):
            return isinstance(model, FSDP)
        """
    ).startswith(
        textwrap.dedent(
            """\
            from torch.distributed.fsdp import (
                FSDPModule,
                # ShardedStateDictConfig, # not used
            )
            """
        )
    )


def test_a_removed_statements_comment_keeps_its_blank_lines():
    code = rewrite(
        """\
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


        def helper():
            return 1


        # made once, used by every save
        policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)


        def save(model):
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, policy):
                return model.state_dict()
        """
    )
    assert "return 1\n\n\n# made once, used by every save\n\n\ndef save(model):" in code


def test_a_function_importing_a_name_itself_gets_the_fsdp2_import_where_its_fsdp1_ones_were():
    code = rewrite(
        """\
        class Saver:
            def state_dict(self, model, sharded, kind):
                if sharded:
                    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

                    state_dict = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
                elif kind == DistributedType.FSDP:
                    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
                    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

                    config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
                    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
                        state_dict = model.state_dict()
                return state_dict
        """
    )
    # `get_model_state_dict` is a local of the method throughout: a module-level import would not reach it
    assert code.startswith("class Saver:\n")
    assert (
        "        elif kind == DistributedType.FSDP:\n"
        "            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict\n"
        "            state_dict = get_model_state_dict("
    ) in code


def test_a_file_that_stays_partly_fsdp1_keeps_the_fsdp1_imports_it_did_not_use():
    source = """\
        from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel as FSDP


        def build(module, cfg):
            return FSDP(module, **cfg.kwargs())
        """
    assert rewrite(source).replace("    # TODO(migrate-fsdp): MF101 FSDP(...) call left as is\n", "") == textwrap.dedent(source)


def test_new_imports_take_their_isort_places():
    """A file whose imports were sorted stays sorted: a standard-library import joins (or opens) its section,
    a new `from` line goes where its module sorts, names merged into a sorted line keep it sorted."""
    assert rewrite(
        """\
        import os

        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


        def save(module, path):
            model = FSDP(module, device_id=torch.device("cpu"))
            for step in range(2):
                with model.no_sync():
                    model(torch.ones(2)).sum().backward()
            torch.save(model.state_dict(), os.path.join(path, "model.pt"))
        """
    ).split("\n\n\n")[0] == textwrap.dedent(
        """\
        import os
        from contextlib import contextmanager

        import torch
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard"""
    )


def test_a_new_import_joins_its_packages_section_not_the_projects_own():
    """No FSDP import to stand in for: a torch import goes after the file's last torch line, sorted among the
    `from torch...` lines there, not below the project's own section (`from common import ...`)."""
    common = b"import torch\nfrom torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n\n\ndef setup_model():\n    return FSDP(torch.nn.Linear(2, 1))\n"
    train = textwrap.dedent(
        """\
        import torch
        import torch.distributed as dist
        from torch.nn.utils import parametrize

        from common import setup_model

        model = setup_model()
        print(model.clip_grad_norm_(1.0), parametrize, dist)
        """
    )
    selection = Selection.from_prefixes(None, None)
    files = {"common.py": common, "train.py": train.encode()}
    results = rewrite_program([ParsedFile(data, path, selection, True) for path, data in files.items()], files)
    out = next(r for r in results if r.path == "train.py").new_source.decode()
    assert out.startswith(
        textwrap.dedent(
            """\
            import torch
            import torch.distributed as dist
            from torch.distributed.tensor import DTensor
            from torch.nn.utils import clip_grad_norm_, parametrize

            from common import setup_model"""
        )
    )


def test_a_method_call_made_a_helper_call_keeps_its_arguments_a_line_each():
    out = rewrite(
        """\
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


        def main(path):
            model = FSDP(torch.nn.Linear(4, 4), device_id=torch.device("cpu"))
            missing, unexpected = model.load_state_dict(
                torch.load(
                    path,
                    map_location="cpu",
                ),
                strict=False,
            )
            return missing
        """
    )
    assert textwrap.indent(
        textwrap.dedent(
            """\
            missing, unexpected = fsdp2_load_state_dict(
                model,
                torch.load(
                    path,
                    map_location="cpu",
                ),
                strict=False,
            )
            """
        ),
        "    ",
    ) in out
