"""What every command of the `tempo-jax` command line shares: errors, value types, output files, JSON inputs, and
options generated from a config dataclass.

`config_options(parser, ServeConfig)` adds one option per field of a frozen config dataclass — the flag from the
field's name (``tokens_per_rank`` → ``--tokens-per-rank``), the value type from its annotation (int, float, str,
bool as ``--x / --no-x``, ``| None`` accepting ``none``), the default from the field and the help from the class
docstring's ``Attributes:`` entry — and `config_from_args(ServeConfig, args)` builds the config back, so the command
line cannot drift from the config: the config's own checks (`__post_init__`) judge every value.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
import types
import typing
from pathlib import Path

import numpy as np

from solvers.checks import read_json

__all__ = [
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "Parser",
    "UsageError",
    "block_options",
    "build_from_json",
    "config_from_args",
    "config_options",
    "fake_cpu_devices",
    "field_docs",
    "int_at_least",
    "number_list",
    "policy_options",
    "prepare_out",
    "prepare_out_dir",
    "real",
]

EXIT_USAGE = 2  # bad options, arguments or input files (argparse's own status for usage errors)
EXIT_FAILURE = 1  # the work itself failed


class UsageError(ValueError):
    """A bad command line or input file: reported on one line with exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `main` prints them (argparse would print the usage block too)."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


# ------------------------------------------------------------------------------------ option value types
def int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def real(minimum: float = 0.0, *, strict: bool = True):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not np.isfinite(value) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {minimum}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def number_list(kind: type, minimum: float):
    def parse(text: str) -> tuple:
        out = []
        for item in text.split(","):
            try:
                value = kind(item)
            except ValueError:
                word = "integers" if kind is int else "numbers"
                msg = f"must be comma-separated {word}, got {item.strip()!r} in {text!r}"
                raise argparse.ArgumentTypeError(msg) from None
            if not np.isfinite(value) or value < minimum:
                raise argparse.ArgumentTypeError(f"values must be finite and >= {minimum}, got {item.strip()}")
            out.append(value)
        return tuple(out)

    parse.__name__ = "list"
    return parse


# ----------------------------------------------------------------------------------------- files
_VIRTUAL_ROOTS = ("/proc", "/sys", "/dev")  # kernel file systems: nothing a run writes belongs there


def _not_virtual(out: Path, option: str, path: str) -> None:
    real = str(out.resolve())
    if any(real == r or real.startswith(r + "/") for r in _VIRTUAL_ROOTS):
        raise UsageError(
            f"{option} {path}: {real} is on a kernel file system ({', '.join(_VIRTUAL_ROOTS)}); give a file on disk"
        )


def _probe_write(folder: Path, option: str, path: str) -> None:
    """Create and remove a file in ``folder``: the only sure test that the run's results can be written there."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".tempo-jax-probe-"):
            pass
    except OSError as err:
        raise UsageError(f"{option} {path}: cannot write in {folder} ({err.strerror or err})") from None


def prepare_out(path: str | None, option: str = "--out") -> Path | None:
    """Check an output file before the work: a non-empty name, not a folder, device or kernel file (``/dev/full``,
    ``/proc/...``; ``/dev/null`` is fine), an existing file writable, its folder creatable (created now) and
    writable (probed)."""
    if path is None:
        return None
    if not str(path).strip():
        raise UsageError(f"{option} is empty; give a file name, or leave {option} out to write nothing")
    out = Path(path).expanduser()
    if str(out) == os.devnull:  # writing nothing on purpose
        return out
    if out.is_dir():
        raise UsageError(f"{option} {path} is a folder; give a file name inside it")
    _not_virtual(out, option, path)
    if out.exists() and not out.is_file():
        raise UsageError(f"{option} {path} is not a regular file (a device, pipe or socket); give a file name")
    if out.exists() and not os.access(out, os.W_OK):
        raise UsageError(f"{option} {path} exists and is not writable")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{option} {path}: cannot create its folder {out.parent} ({err.strerror or err})") from None
    _probe_write(out.parent, option, path)
    return out


def prepare_out_dir(path: str, option: str = "--out", *, writes: str = "its results") -> Path:
    """Check an output folder before the work: a non-empty name, not an existing file, not on a kernel file system,
    created now and writable (probed). ``writes`` names what goes there, for the messages."""
    if not str(path).strip():
        raise UsageError(f"{option} is empty; give the folder for {writes}")
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"{option} {path} is a file; give a folder (the command writes {writes} inside it)")
    _not_virtual(out, option, path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{option} {path}: cannot create the folder ({err.strerror or err})") from None
    _probe_write(out, option, path)
    return out


def build_from_json(path: str, option: str, build):
    """``build(dict)`` of the JSON object in ``path``; every error (missing file, bad JSON, not an object, what
    ``build`` raises) is a usage error naming the option and the file."""
    try:
        data = read_json(path, option)
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err)) from None
    if not isinstance(data, dict):
        raise UsageError(f"{option} {path}: expected a JSON object {{...}}, got {type(data).__name__}")
    try:
        return build(data)
    except (ValueError, TypeError) as err:
        raise UsageError(f"{option} {path}: {err}") from None


def policy_options(text: str | None) -> dict:
    """``--options`` JSON → a dict of policy options."""
    if not text:
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"--options: invalid JSON ({err.msg} at column {err.colno}) in {text!r}") from None
    if not isinstance(options, dict):
        raise UsageError(f"--options must be a JSON object such as '{{\"tau\": 0.0}}', got {text!r}")
    return options


def block_options(parser: argparse.ArgumentParser) -> None:
    """Add the benchmarks' MoE-block options: ``--experts`` (E), ``--top-k`` (K), ``--hidden`` (H), ``--ffn`` (F)
    and ``--preset`` (a `tempo_jax.layer.presets` name whose router, experts and shared experts run at those sizes).
    """
    from ..layer.presets import MOE_PRESETS  # the layer (and jax) only for the commands that build a block

    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--ffn", type=int, default=128)
    parser.add_argument(
        "--preset",
        choices=MOE_PRESETS,
        default=None,
        help="run this model's MoE block (router, experts, shared experts) at the sizes above",
    )


def fake_cpu_devices(n: int = 8) -> None:
    """Let the CPU backend expose ``n`` devices (expert parallelism on one host) unless already configured or jax's
    backends are already up (the flag is read when they start). It does not affect GPUs."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" in flags:
        return
    if "jax" in sys.modules:
        try:
            from jax._src import xla_bridge

            if xla_bridge.backends_are_initialized():
                return
        except (ImportError, AttributeError):  # another jax layout: only set the flag before jax is imported
            return
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


# ----------------------------------------------------------------------------------- options from configs
_ENTRY = re.compile(r"^ {6}(\w+(?:, \w+)*): (.*)$")


def field_docs(cls: type) -> dict[str, str]:
    """``{field: help}`` from the ``Attributes:`` section of ``cls``'s docstring: entries ``name: text`` (or
    ``a, b: text`` for several fields) indented six spaces, continued on deeper-indented lines."""
    doc = cls.__doc__ or ""
    if "Attributes:" not in doc:
        return {}
    out: dict[str, str] = {}
    names: list[str] = []
    for line in doc.split("Attributes:", 1)[1].splitlines():
        m = _ENTRY.match(line)
        if m:
            names = [n.strip() for n in m.group(1).split(",")]
            for n in names:
                out[n] = m.group(2).strip()
        elif line.startswith(" " * 8) and names:
            for n in names:
                out[n] += " " + line.strip()
        elif line.strip() and not line.startswith(" " * 6):
            break
    return {k: re.sub(r"``([^`]*)``", r"\1", v).replace("`", "") for k, v in out.items()}


def _value_type(annotation) -> tuple[type, bool]:
    """``(base type, optional)`` of a field annotation such as ``int``, ``float | None``, ``str | None``."""
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        base = [a for a in args if a is not type(None)]
        if len(base) != 1:
            raise TypeError(f"config_options: cannot make an option of type {annotation}")
        return base[0], type(None) in args
    return annotation, False


def _parser_of(kind: type, optional: bool):
    def parse(text: str):
        if optional and text.strip().lower() == "none":
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {'an integer' if kind is int else 'a number'}, got {text!r}{' (or none)' if optional else ''}"
            ) from None

    parse.__name__ = kind.__name__
    return parse


def config_options(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    skip=(),
    aliases: dict | None = None,
    choices: dict | None = None,
    title: str | None = None,
) -> list[str]:
    """Add an option per field of the dataclass ``cls`` (see the module); returns the field names added.

    Args:
      skip: fields without an option. aliases: ``{field: ["--old-flag", ...]}`` extra spellings.
      choices: ``{field: names}`` listed in the help (the config checks the value).
      title: an argument group for the options (default: the class name).
    """
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    aliases, choices = aliases or {}, choices or {}
    group = parser.add_argument_group(title or f"{cls.__name__} (every field is an option)")
    added = []
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        flags = ["--" + f.name.replace("_", "-"), *aliases.get(f.name, ())]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kind, optional = _value_type(hints[f.name])
        text = docs.get(f.name, "")
        if f.name in choices:
            text += f" One of: {', '.join(map(str, choices[f.name]))}."
        if kind is bool:
            group.add_argument(
                *flags,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f"{text} (default {default})".strip(),
            )
        elif kind in (int, float, str):
            shown = "none" if default is None else default
            group.add_argument(
                *flags,
                dest=f.name,
                type=_parser_of(kind, optional),
                default=default,
                metavar=kind.__name__.upper(),
                help=f"{text} (default {shown})".strip(),
            )
        else:
            raise TypeError(f"config_options: {cls.__name__}.{f.name} has type {kind}, which has no option type")
        added.append(f.name)
    parser.set_defaults(**{f"_fields_{cls.__name__}": tuple(added)})
    return added


def config_from_args(cls: type, args: argparse.Namespace, **overrides):
    """The config ``cls`` from the options `config_options` added (its own checks judge the values)."""
    names = getattr(args, f"_fields_{cls.__name__}")
    return cls(**{**{n: getattr(args, n) for n in names}, **overrides})
