"""`migrate-fsdp convert-ckpt`: FULL_STATE_DICT checkpoints to DCP (and back), streamed, verified.

The conversion never imports torch on its main path: torch.save zip files,
safetensors and DCP directories are plain file formats, so tensors are copied
byte range to byte range (in the kernel where it can) and only the small
pickles are parsed, by a restricted unpickler. torch is imported only for what
needs arithmetic or a model: `--dtype`, `--check-against`, legacy
(pre-1.6, non-zip) torch.save files.
"""
