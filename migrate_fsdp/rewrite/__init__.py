"""`migrate-fsdp rewrite`: the LibCST codemod from FSDP1 to FSDP2."""
