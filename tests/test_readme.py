"""Every command the README gives still parses: its program, flags, choices, config files and
--set keys exist. The README is the front door; a renamed flag must fail here, not for a user.

Nothing runs: `ArgumentParser.parse_args` is patched to stop with what it parsed, so `lsan
train ...` checks its flags (and its configuration, built as `cmd_train` builds it) without
training. `make` lines name a Makefile target; a test command names a test file.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

from lsan.cli import _named_runs, build_run

REPO = Path(__file__).resolve().parents[1]


class Parsed(Exception):  # noqa: N818 (a signal, not an error)
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.namespace = args


def readme_commands() -> list[str]:
    """The command lines of the README's bash blocks, continuations joined, comments dropped."""
    text = (REPO / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            tokens = shlex.split(line, comments=True)
            if tokens:
                out.append(shlex.join(tokens))
    return out


COMMANDS = readme_commands()


def entry(tokens: list[str]) -> tuple[str, list[str]]:
    """(the module whose main() owns the command, its argv)."""
    if tokens[0] == "torchrun":
        i = tokens.index("-m")
        tokens = tokens[i + 1 :]
    if tokens[0] == "lsan":
        return "lsan.cli", tokens[1:]
    if tokens[:2] == ["python", "export/export.py"]:
        return "lsan.export.export", tokens[2:]
    if tokens[:2] == ["python", "-m"] and tokens[2].split(".")[0] in ("benchmarks", "serving"):
        return f"lsan.{tokens[2]}", tokens[3:]
    raise AssertionError(f"a README command this test does not know how to check: {tokens}")


def parse(module: str, argv: list[str], monkeypatch) -> argparse.Namespace:
    original = argparse.ArgumentParser.parse_args

    def stop(self, args=None, namespace=None):
        raise Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    main = importlib.import_module(module).main
    with pytest.raises(Parsed) as got:  # SystemExit(2) here = a flag the program refuses
        main(argv)
    return got.value.namespace


def test_the_readme_gives_commands_of_every_kind():
    firsts = {shlex.split(c)[0] for c in COMMANDS}
    assert {"make", "lsan", "python", "torchrun"} <= firsts and len(COMMANDS) >= 40


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[:60])
def test_a_readme_command_parses(command, monkeypatch):
    tokens = [t.strip("[]") for t in shlex.split(command)]  # `[--force]`: an optional flag
    while "=" in tokens[0] and not tokens[0].startswith("-"):  # VAR=value before the program
        tokens = tokens[1:]
    if tokens[0] == "make":
        targets = re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M)
        assert tokens[1] in targets
        return
    if tokens[0].endswith("pytest"):
        assert all((REPO / t).is_file() for t in tokens[1:] if t.startswith("tests/"))
        return
    module, argv = entry(tokens)
    args = parse(module, argv, monkeypatch)
    command = getattr(args, "command", None) if module == "lsan.cli" else None
    if command == "train":  # its configuration, built as cmd_train builds it
        build_run(args.dataset, args.model, args.config, args.set)
    if command == "compare":
        _named_runs(args)
    for flag in ("config", "space"):
        if command in ("train", "compare", "tune") and getattr(args, flag, None):
            assert (REPO / getattr(args, flag)).is_file()


def test_a_renamed_flag_would_fail_here(monkeypatch):
    """The check can fail: a flag the CLI lacks, and a --set key the config lacks."""
    from lsan.config import ConfigError

    with pytest.raises(SystemExit):
        parse("lsan.cli", ["train", "--dataset", "ml-100k", "--epochs-max", "3"], monkeypatch)
    args = parse("lsan.cli", ["train", "--set", "train.lr_max=1", "--out", "x"], monkeypatch)
    with pytest.raises(ConfigError, match="unknown setting 'train.lr_max'"):
        build_run(args.dataset, args.model, args.config, args.set)
