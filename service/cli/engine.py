"""`zeroserve engine --gateway tcp://HOST:PORT [MODEL]`: a headless engine that joins a gateway
on another host, and `zeroserve keys generate`: CURVE key files for such links."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from proto.engine_link import add_link_args, link_config_from, remote_addresses
from service.client.curve import generate_keys
from service.client.engine_launcher import engine_argv, engine_environ
from service.flags.engine_flags import add_engine_args, add_model_arg, engine_config_from
from service.observability.logging_setup import configure_logging


def add_engine_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "engine",
        help="run a headless engine that joins a gateway (zeroserve serve --engine-address) on another host",
        description=(
            "Loads the model and joins the gateway at --gateway: it registers (protocol, model, KV "
            "capacity), sends a heartbeat every second and takes requests until SIGTERM, when it "
            "drains (finishes what it has) and leaves."
        ),
    )
    add_model_arg(parser)
    parser.add_argument("--gateway", required=True, metavar="tcp://HOST:PORT", help="the gateway's --engine-address")
    add_link_args(parser, has_headless_flag=False)
    add_engine_args(parser)


def run_engine(args: argparse.Namespace) -> int:
    """Resolves (fetches) the model, then becomes the engine process."""
    configure_logging()
    try:
        input_address, output_address = remote_addresses(args.gateway)
        link = link_config_from(args, is_headless=True)
    except ValueError as exc:
        print(f"zeroserve engine: error: {exc}", file=sys.stderr)
        return 2
    from service.model_files.model_registry import resolve_model

    try:
        resolved = resolve_model(args.model)
    except ValueError as exc:
        print(f"zeroserve engine: error: {exc}", file=sys.stderr)
        return 2
    engine = engine_config_from(args, str(resolved.path), resolved.name)
    argv = [*engine_argv(engine, -1, input_address, output_address), *link.to_argv()]
    os.execve(sys.executable, [sys.executable, "-m", "engine_proc", *argv], engine_environ(os.environ))


def add_keys_parser(commands: Any) -> None:
    keys = commands.add_parser("keys", help="CURVE key files for links to engines on other hosts")
    actions = keys.add_subparsers(dest="keys_command", required=True)
    generate = actions.add_parser(
        "generate", help="write NAME.key (public, share it) and NAME.key_secret (keep it private)"
    )
    generate.add_argument("--dir", type=Path, required=True, help="folder to write the key files into")
    generate.add_argument("--name", default="gateway", help="file name stem (default: %(default)s)")
    generate.add_argument(
        "--force", action="store_true",
        help="write the secret key even in a git work tree folder git does not ignore, or over an existing key pair",
    )


def run_keys(args: argparse.Namespace) -> int:
    work_tree = git_work_tree_of(args.dir)
    secret_path = args.dir.expanduser().resolve() / f"{args.name}.key_secret"
    if work_tree is not None and not args.force and not is_git_ignored(work_tree, secret_path):
        print(
            f"zeroserve keys generate: error: {args.dir} is inside the git work tree {work_tree} and git does not "
            "ignore it, so a secret key there is one `git add` away from being published; write the keys in an "
            "ignored folder or elsewhere (--dir ~/.config/zeroserve/keys), or pass --force",
            file=sys.stderr,
        )
        return 2
    existing = [path for path in (args.dir / f"{args.name}.key", args.dir / f"{args.name}.key_secret") if path.exists()]
    if existing and not args.force:
        print(
            f"zeroserve keys generate: error: {existing[0]} exists; a new pair would lock out every engine and "
            "gateway that trusts it. Choose another --name, or pass --force to replace it",
            file=sys.stderr,
        )
        return 2
    public, secret = generate_keys(args.dir, args.name)
    print(f"public key: {public}\nsecret key: {secret}")
    return 0


def is_git_ignored(work_tree: Path, path: Path) -> bool:
    """Whether git ignores `path` in `work_tree` (False where git cannot say: no git, not a repository)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(work_tree), "check-ignore", "--quiet", "--", str(path)], capture_output=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def git_work_tree_of(directory: Path) -> Path | None:
    """The git work tree `directory` is (or would be, once made) inside, or None."""
    folder = directory.expanduser().resolve()
    for candidate in (folder, *folder.parents):
        if (candidate / ".git").exists():
            return candidate
    return None
