"""One gateway process's life: its parts wired together and served by hypercorn, and `--api-server-count`'s gateway processes beside the engines."""
