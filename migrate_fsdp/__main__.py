from migrate_fsdp.cli import main

main()
