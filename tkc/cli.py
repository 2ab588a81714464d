"""The ``tkc`` command: build, validate, list, render.

Options are read once here (arguments, then environment variables named in
``--help``) into frozen option objects; no other module reads the environment.
Errors print one message without a traceback (``--debug`` shows it) and exit
with the error's code (2 for bad specs or usage).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

import tkc
from tkc.arch import ARCHS, get_arch, parse_arch_list
from tkc.errors import TkcError, UsageError
from tkc.spec import SpecSet, expand, load_specs

F = TypeVar("F", bound=Callable[..., Any])


def _root_default(name: str) -> Path:
    return Path.cwd() / name


def _handle_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = click.get_current_context().find_root().params.get("debug", False)
        try:
            return fn(*args, **kwargs)
        except TkcError as exc:
            if debug:
                raise
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


def _specs(spec_paths: tuple[Path, ...], templates: Path) -> SpecSet:
    return load_specs(spec_paths or (_root_default("kernel_specs"),), templates)


spec_option = click.option("--specs", "spec_paths", multiple=True, type=click.Path(path_type=Path),
                           help="Spec file or folder (repeatable). Default: ./kernel_specs")
templates_option = click.option("--templates", type=click.Path(path_type=Path), default=None,
                                help="Templates folder. Default: ./templates")


@click.group()
@click.version_option(tkc.__version__, prog_name="tkc")
@click.option("--debug", is_flag=True, help="Show tracebacks of errors.")
def main(debug: bool) -> None:
    """tkc: ahead-of-time compiler for TileLang kernels (specs -> cubins -> per-arch wheels)."""


@main.command()
@spec_option
@templates_option
@_handle_errors
def validate(spec_paths: tuple[Path, ...], templates: Path | None) -> None:
    """Check the specs alone (no TileLang, no nvcc); exit code 2 on any problem."""
    specs = _specs(spec_paths, templates or _root_default("templates"))
    count = sum(len(expand(k)) for k in specs.kernels)
    click.echo(f"ok: {len(specs.kernels)} kernels, {count} variants per arch, package {specs.package.name} "
               f"{specs.package.version} ({', '.join(specs.files)})")


@main.command(name="list")
@spec_option
@templates_option
@click.option("--kernel", default=None, help="Only this kernel.")
@_handle_errors
def list_variants(spec_paths: tuple[Path, ...], templates: Path | None, kernel: str | None) -> None:
    """Show the variants each kernel expands to."""
    specs = _specs(spec_paths, templates or _root_default("templates"))
    kernels = [specs.kernel(kernel)] if kernel else list(specs.kernels)
    for k in kernels:
        variants = expand(k)
        click.echo(f"{k.name} ({k.module}, {k.source}, archs {', '.join(k.archs)}): {len(variants)} variants")
        for v in variants:
            click.echo(f"  {v.id}  {v.describe()}")


@main.command(name="render")
@spec_option
@templates_option
@click.argument("kernel")
@click.option("--variant", "variant_id", default=None, help="Variant id (see tkc list); default: the first.")
@click.option("--set", "values", multiple=True, metavar="KEY=VALUE", help="Pick the variant by grid values.")
@click.option("--arch", default="sm90", show_default=True)
@_handle_errors
def render_cmd(spec_paths: tuple[Path, ...], templates: Path | None, kernel: str, variant_id: str | None,
               values: tuple[str, ...], arch: str) -> None:
    """Print the TileLang source of one variant."""
    from tkc.render import render_source

    tdir = templates or _root_default("templates")
    spec = _specs(spec_paths, tdir).kernel(kernel)
    wanted = dict(v.split("=", 1) for v in values)
    candidates = [v for v in expand(spec) if (variant_id is None or v.id == variant_id)
                  and all(str(dict(v.params).get(k)) == val for k, val in wanted.items())]
    if not candidates:
        raise UsageError(f"no variant of {kernel} matches {variant_id or ''} {' '.join(values)}; see tkc list "
                         f"--kernel {kernel}")
    click.echo(render_source(candidates[0], get_arch(arch), tdir), nl=False)


def _format_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError


@main.command(name="build")
@spec_option
@templates_option
@click.option("--arch", "arch_list", default=",".join(ARCHS), show_default=True, help="Comma-separated archs.")
@click.option("-j", "--jobs", default=1, show_default=True, type=click.IntRange(1, 256),
              help="Variants lowered and compiled in parallel.")
@click.option("--build-dir", type=click.Path(path_type=Path), default=None, help="Default: ./build")
@click.option("--dist", "dist_dir", type=click.Path(path_type=Path), default=None, help="Default: ./dist")
@click.option("--nvcc", default=None, envvar="TKC_NVCC",
              help="nvcc to use: a path, or 'system' for $CUDA_HOME/bin or PATH. Default: nvcc from PyPI. "
                   "[env: TKC_NVCC]")
@_handle_errors
def build_cmd(spec_paths: tuple[Path, ...], templates: Path | None, arch_list: str, jobs: int,
              build_dir: Path | None, dist_dir: Path | None, nvcc: str | None) -> None:
    """Build every spec for every arch: cubins, packages, and one wheel per arch in dist/."""
    from tkc.build import BuildOptions, build, plan

    tdir = templates or _root_default("templates")
    options = BuildOptions(
        specs=_specs(spec_paths, tdir), templates=tdir, build_dir=build_dir or _root_default("build"),
        dist_dir=dist_dir or _root_default("dist"), archs=parse_arch_list(arch_list), jobs=jobs, nvcc=nvcc,
    )
    start = time.perf_counter()
    total = len(plan(options))
    with click.progressbar(length=total, label="compiling", file=sys.stderr,
                           show_pos=True, item_show_func=None) as bar:
        summaries = build(options, progress=bar.update)
    rows = [("arch", "variants", "compiled", "cached", "compile s", "wheel", "size")]
    rows += [(s.arch.name, str(s.variants), str(s.compiled), str(s.cached), f"{s.seconds:.1f}", s.wheel.name,
              _format_bytes(s.wheel_bytes)) for s in summaries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            click.echo("  ".join("-" * w for w in widths))
    click.echo(f"done in {time.perf_counter() - start:.1f} s; wheels in {options.dist_dir}")


if __name__ == "__main__":
    main()
