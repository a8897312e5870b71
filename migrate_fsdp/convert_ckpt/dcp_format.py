"""The `.metadata` file of a DCP checkpoint, written and read without torch.distributed.checkpoint.

FileSystemWriter pickles a `torch.distributed.checkpoint.metadata.Metadata`
(protocol 4): per flat key a TensorStorageMetadata (dtype, size, chunks with
offsets and sizes) or a BytesStorageMetadata; `planner_data`, the flat key ->
nested path map; `storage_data`, MetadataIndex(fqn, chunk offsets, index hint)
-> _StorageInfo(file, offset, length) of the torch.save blob holding it. The
builders below produce the same opcodes as those dataclasses; the reader maps
the same globals to plain records (reading a DCP with pickle.load would run
whatever the file names).
"""

import uuid

from migrate_fsdp.convert_ckpt.pickling import GlobalRef, NewObj, Reduced, TorchSize, dtype_ref

METADATA_FILE = ".metadata"
DCP_VERSION = "1.0.0"
_MD = "torch.distributed.checkpoint.metadata"
_FS = "torch.distributed.checkpoint.filesystem"

_TENSOR_MD = GlobalRef(_MD, "TensorStorageMetadata")
_BYTES_MD = GlobalRef(_MD, "BytesStorageMetadata")
_CHUNK_MD = GlobalRef(_MD, "ChunkStorageMetadata")
_PROPERTIES = GlobalRef(_MD, "TensorProperties")
_MEM_FORMAT = GlobalRef(_MD, "_MEM_FORMAT_ENCODING")
_INDEX = GlobalRef(_MD, "MetadataIndex")
_STORAGE_META = GlobalRef(_MD, "StorageMeta")
_METADATA = GlobalRef(_MD, "Metadata")
_STORAGE_INFO = GlobalRef(_FS, "_StorageInfo")
_STRIDED = Reduced(GlobalRef("torch.serialization", "_get_layout"), ("torch.strided",))


def tensor_entry(dtype, size, chunks) -> NewObj:
    """TensorStorageMetadata for a tensor stored as `chunks`: (offsets, sizes) pairs."""
    properties = NewObj(_PROPERTIES, (dtype_ref(dtype), _STRIDED, False, Reduced(_MEM_FORMAT, (0,)), False))
    return NewObj(
        _TENSOR_MD,
        {
            "properties": properties,
            "size": TorchSize(size),
            "chunks": [NewObj(_CHUNK_MD, {"offsets": TorchSize(o), "sizes": TorchSize(s)}) for o, s in chunks],
        },
    )


BYTES_ENTRY = NewObj(_BYTES_MD, None)  # BytesStorageMetadata: no fields


def storage_key(fqn: str, offsets=None, index=None) -> NewObj:
    state = {"fqn": fqn, "index": index}
    if offsets is not None:
        state["offset"] = TorchSize(offsets)
    return NewObj(_INDEX, state)


def storage_info(relative_path: str, offset: int, length: int) -> NewObj:
    return NewObj(_STORAGE_INFO, {"relative_path": relative_path, "offset": offset, "length": length})


def metadata(entries: dict, planner_data: dict, storage_data: dict, checkpoint_id: str) -> NewObj:
    storage_meta = NewObj(
        _STORAGE_META, {"checkpoint_id": checkpoint_id, "save_id": str(uuid.uuid4()), "load_id": None, "modules": []}
    )
    return NewObj(
        _METADATA,
        {
            "state_dict_metadata": entries,
            "planner_data": planner_data,
            "storage_data": storage_data,
            "storage_meta": storage_meta,
            "version": DCP_VERSION,
        },
    )


class Record:
    """An instance of a DCP metadata class, read as plain attributes."""

    planner_data = storage_data = storage_meta = version = offset = index = transform_descriptors = None

    def __init__(self, *args):
        self.args = args

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.__dict__.update(state)
        elif isinstance(state, tuple) and type(self).__name__ == "TensorProperties":
            self.dtype = state[0]  # (dtype, layout, requires_grad, memory format, pin_memory)
        else:
            self.state = state


_CLASS_NAMES = {
    _MD: [
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
        "MetadataIndex",
        "StorageMeta",
    ],
    _FS: ["_StorageInfo"],
    # torch < 2.1 reused ShardedTensor's properties in DCP metadata
    "torch.distributed._shard.sharded_tensor.metadata": ["TensorProperties", "MEM_FORMAT_ENCODING"],
}
METADATA_GLOBALS = {
    (module, name): type(name, (Record,), {}) for module, names in _CLASS_NAMES.items() for name in names
}


def is_bytes_entry(entry) -> bool:
    return type(entry).__name__ == "BytesStorageMetadata"
