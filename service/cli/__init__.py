"""The `zeroserve` command line: its subcommands and the engine flags they share."""
