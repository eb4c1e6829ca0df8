"""Argument types and the parser of the `specgate` command: every bad value ends in ONE line,
`specgate: error: argument --FLAG: why`, exit status 2, never a traceback or a usage dump.

argparse names the flag itself when a type function raises ArgumentTypeError; `Parser.error`
drops the usage block argparse prints before the message (`specgate CMD --help` shows it).
"""
import argparse
import re
import sys
from pathlib import Path
from typing import NoReturn

DEVICE = re.compile(r"cpu|cuda(:\d+)?")


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error; subparsers are made with the same class."""

    def error(self, message: str) -> NoReturn:
        print(f"specgate: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


def int_at_least(lo: int, hi: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"must be an integer {bound}, got {value}")
        return value
    parse.__name__ = f"int >= {lo}"
    return parse


def float_in(lo: float, hi: float | None = None, *, lo_open: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value != value or (value <= lo if lo_open else value < lo) or (hi is not None and value > hi):
            left = "(" if lo_open else "["
            bound = f"in {left}{lo}, {hi}]" if hi is not None else f"{'>' if lo_open else '>='} {lo}"
            raise argparse.ArgumentTypeError(f"must be a number {bound}, got {text}")
        return value
    return parse


def int_list(lo: int, hi: int):
    """A comma-separated list of integers in [lo, hi], e.g. --concurrency 1,8."""
    one = int_at_least(lo, hi)

    def parse(text: str) -> list[int]:
        parts = [p.strip() for p in text.split(",")]
        if not parts or any(not p for p in parts):
            raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,8, got {text!r}")
        try:
            return [one(p) for p in parts]
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (in {text!r})") from None
    return parse


def choice_list(*choices: str):
    """A comma-separated list of distinct values out of `choices`, in any order (the order given
    is kept), e.g. --attention-backends flex,sdpa."""
    def parse(text: str) -> tuple[str, ...]:
        parts = tuple(p.strip() for p in text.split(","))
        unknown = [p for p in parts if p not in choices]
        if unknown or len(set(parts)) != len(parts):
            raise argparse.ArgumentTypeError(f"expected distinct values out of {', '.join(choices)}, comma-separated, "
                                             f"got {text!r}")
        return parts
    return parse


def folder(text: str) -> str:
    """An existing folder (a model or drafter): refused here, before any engine or pytest starts."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such folder: {text}")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a folder: {text}")
    return text


def output_file(text: str) -> str:
    """A file to write: its folder must exist (checked before a long run, not after it)."""
    parent = Path(text).expanduser().resolve().parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: folder {parent} does not exist")
    return text


def device(text: str) -> str:
    if not DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text
