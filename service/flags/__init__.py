"""Command-line flags made from the settings dataclasses, shared by every command (cli/, bench/) and by
`LLM()` (its ZEROSERVE_<FLAG> variables)."""
