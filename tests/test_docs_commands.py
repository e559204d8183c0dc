"""Every command the docs name exists and takes the flags they give it: `zeroserve ...` and `python -m
service ...` against the real parser, `python -m benchmarks.X` / `benchmarks/X.py` and `python -m
engine_proc` against their `--help`, `make TARGET VAR=...` against the Makefile; every other `--flag` the
docs and deploy files name belongs to one of those commands (or to a named other tool), and every
`ZEROSERVE_*` variable is one the code reads."""

from __future__ import annotations

import argparse
import functools
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from proto import envs
from service.cli.main import ENV_COMMANDS, _subparser, build_parser, config_from_args, parse_args
from service.models.catalog import find_models

ROOT = Path(__file__).resolve().parent.parent
MARKDOWN = (ROOT / "README.md", ROOT / "deploy" / "README.md", ROOT / "service" / "openai" / "CONFORMANCE.md")
DEPLOY_FILES = (ROOT / "deploy" / "Dockerfile", ROOT / "deploy" / "docker-compose.yml", *sorted((ROOT / "deploy" / "k8s").glob("*.yaml")))
FENCE = re.compile(r"^```\w*\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
ENV_VAR = re.compile(r"\bZEROSERVE_[A-Z0-9_]*[A-Z0-9]\b")
COMMAND = re.compile(
    r"(?:\.venv/bin/)?zeroserve(?= )|(?:\.venv/bin/)?python3? -m [\w.]+|(?<![\w/])benchmarks/\w+\.py|(?<![\w-])make [\w-]+"
)
# NOTE: where a command ends on a line (what follows is another command's or the shell's).
SHELL_OPERATOR = re.compile(r"\s(?:&&|\|\||\||;|&|>|<|\)|\})(?:\s|$)|`")
# The flags the docs name of other tools, and whose they are.
OTHER_TOOLS_FLAGS = {
    "--no-deps": "pip", "--index-url": "pip", "--no-cache-dir": "pip", "--no-install-recommends": "apt-get",
    "--interval": "HEALTHCHECK", "--timeout": "HEALTHCHECK", "--retries": "HEALTHCHECK", "--start-period": "HEALTHCHECK", "--rm": "docker", "--platform": "docker buildx", "--build": "docker compose",
    "--from-file": "kubectl", "--replicas": "kubectl", "--trust-request-chat-template": "vLLM",
    "--enable-per-request-metrics": "vLLM", "--kv-cache-metrics": "vLLM", "--models-max": "llama-server", "--embedding": "llama-server", "--pooling": "llama-server",
}
# NOTE: modules the docs run that have no parser: not run here, since `--help` would not stop them.
TAKES_NO_ARGUMENTS = frozenset({"service.openai.conformance"})


@dataclass(frozen=True)
class Command:
    """One command line the docs print (in a code block, an inline span or a deploy file)."""

    source: str
    words: tuple[str, ...]

    @property
    def flags(self) -> list[str]:
        return [word.split("=", 1)[0] for word in self.words if FLAG.fullmatch(word.split("=", 1)[0])]


def logical_lines(text: str) -> list[str]:
    """The docs' lines with shell continuations joined, and each inline code span as a line of its own."""
    blocks = FENCE.findall(text)
    prose = FENCE.sub("", text)
    spans = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]
    joined = "\n".join(blocks).replace("\\\n", " ")
    return [*joined.splitlines(), *spans]


def commands_in(path: Path) -> list[Command]:
    commands = []
    for line in logical_lines(path.read_text()):
        for match in COMMAND.finditer(line):
            rest = line[match.start():]
            end = SHELL_OPERATOR.search(rest)
            text = rest[: end.start()] if end else rest
            try:
                words = shlex.split(text)
            except ValueError:  # NOTE: a span cut inside a quoted JSON value
                words = text.split()
            commands.append(Command(path.name, tuple(words)))
    return commands


def zeroserve_argv(command: Command) -> list[str] | None:
    """The arguments after `zeroserve` (or `python -m service`), or None for another command."""
    first, *rest = command.words
    if first.endswith("zeroserve"):
        return rest
    if Path(first).name.startswith("python") and rest[:2] == ["-m", "service"]:
        return rest[2:]
    return None


def zeroserve_command(argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The (sub)parser that `zeroserve ARGV` reaches, and the command's path."""
    parser, path = build_parser(), []
    for word in argv:
        commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not commands or word not in commands[0].choices:
            break
        parser, path = commands[0].choices[word], [*path, word]
    return parser, path


def parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


@functools.cache
def every_zeroserve_flag() -> frozenset[str]:
    flags: set[str] = set()
    pending = [build_parser()]
    while pending:
        parser = pending.pop()
        flags |= parser_flags(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending += action.choices.values()
    return frozenset(flags)


@functools.cache
def module_flags(module: str) -> frozenset[str]:
    """The flags `python -m MODULE --help` lists under its options."""
    if module in TAKES_NO_ARGUMENTS:
        return frozenset()
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"python -m {module} --help: {done.stderr[-2000:]}"
    options = done.stdout.split("\noptions:\n", 1)[1]
    return frozenset(re.findall(r"^\s+(?:-\w, )?(--[\w-]+)", options, re.MULTILINE))


def module_of(command: Command) -> str | None:
    """`benchmarks.soak` for `python -m benchmarks.soak` or `benchmarks/soak.py`; `engine_proc`."""
    first, *rest = command.words
    if first.startswith("benchmarks/"):
        return first.removesuffix(".py").replace("/", ".")
    if Path(first).name.startswith("python") and rest[:1] == ["-m"] and rest[1:2] != ["service"]:
        return rest[1]
    return None


def makefile_names() -> tuple[set[str], set[str]]:
    """The Makefile's targets and its variables."""
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([\w-]+):", text, re.MULTILINE)), set(re.findall(r"^(\w+) [?:]?=", text, re.MULTILINE))


def doc_commands() -> list[Command]:
    return [command for path in MARKDOWN for command in commands_in(path)]


def zeroserve_ids(commands: list[Command]) -> list[object]:
    return [pytest.param(command, id=f"{command.source}: {' '.join(command.words)[:80]}")
            for command in commands if zeroserve_argv(command) is not None]


# NOTE: the deploy files' command lines are parsed whole by the real parser in tests/deploy/.
@pytest.mark.parametrize("command", zeroserve_ids(doc_commands()))
def test_each_zeroserve_command_takes_the_flags_the_docs_give_it(command: Command) -> None:
    argv = zeroserve_argv(command)
    assert argv is not None
    parser, path = zeroserve_command(argv)
    unknown = [flag for flag in command.flags if flag not in parser_flags(parser)]
    assert not unknown, f"`zeroserve {' '.join(path)}` has no {unknown} ({command.source}: {' '.join(command.words)})"


@pytest.mark.slow  # NOTE: each module's --help runs in a process of its own (imports torch: ~2 s each)
def test_each_python_module_the_docs_run_exists_and_takes_their_flags() -> None:
    modules = [(module, command) for command in doc_commands() if (module := module_of(command))]
    assert {"benchmarks.structured_outputs", "engine_proc"} <= {module for module, _ in modules}
    for module, command in modules:
        assert (ROOT / module.replace(".", "/")).with_suffix(".py").is_file() or (ROOT / module).is_dir(), module
        unknown = [flag for flag in command.flags if flag not in module_flags(module)]
        assert not unknown, f"`python -m {module}` has no {unknown} ({command.source}: {' '.join(command.words)})"


def test_each_make_command_names_a_target_and_variables_of_the_makefile() -> None:
    targets, variables = makefile_names()
    commands = [command for command in doc_commands() if command.words[0] == "make"]
    assert len(commands) >= 3
    for command in commands:
        target, *assignments = command.words[1:]
        assert target in targets, f"no make target {target!r} ({' '.join(command.words)})"
        names = dict(word.split("=", 1) for word in assignments if "=" in word)
        assert set(names) <= variables, f"the Makefile sets no {sorted(set(names) - variables)}"
        if target == "serve" and "ARGS" in names:
            serve = _subparser(build_parser(), "serve")
            assert set(FLAG.findall(names["ARGS"])) <= parser_flags(serve), names["ARGS"]


@pytest.mark.slow  # NOTE: the modules' --help, as above
def test_every_flag_the_docs_name_is_one_a_command_takes() -> None:
    known = every_zeroserve_flag() | {flag for command in doc_commands() if (module := module_of(command))
                                      for flag in module_flags(module)} | set(OTHER_TOOLS_FLAGS)
    for path in (*MARKDOWN, *DEPLOY_FILES):
        unknown = sorted(set(FLAG.findall(path.read_text())) - known)
        assert not unknown, f"{path.relative_to(ROOT)} names flags no command takes: {unknown}"


def test_every_zeroserve_variable_the_docs_name_is_read() -> None:
    parser = build_parser()
    flag_vars = {envs.flag_var_name(action) for path in ENV_COMMANDS for action in envs.flag_actions(_subparser(parser, *path))}
    known = set(envs.ENV_VARS) | flag_vars
    for path in (*MARKDOWN, *DEPLOY_FILES):
        unknown = sorted(set(ENV_VAR.findall(path.read_text())) - known)
        assert not unknown, f"{path.relative_to(ROOT)} names variables zeroserve does not read: {unknown}"


def test_the_models_config_example_serves_as_printed(default_model_path: Path, tmp_path: Path) -> None:
    """The README's --models-config file, saved as it says, and the command it gives: every model listed, none failed."""
    readme = (ROOT / "README.md").read_text()
    (example,) = [block for block in FENCE.findall(readme) if block.startswith("[models.")]
    (command,) = [c for c in commands_in(ROOT / "README.md") if "--models-config" in c.words and len(c.words) > 3]
    (tmp_path / "models.toml").write_text(example)
    argv = zeroserve_argv(command)
    assert argv is not None
    config = config_from_args(parse_args([*argv[:-1], str(tmp_path / argv[-1])], environ={}))
    entries = {entry.id: entry for entry in find_models(config)}
    assert sorted(entries) == ["smollm2-135m-instruct", "smollm2-tools"]
    assert [entry.error for entry in entries.values()] == [None, None]
    assert entries["smollm2-135m-instruct"].aliases == ("gpt-4o-mini",)
    assert entries["smollm2-tools"].config.engine.max_num_seqs == 16
