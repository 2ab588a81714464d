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
from typing import TYPE_CHECKING, Any, TypeVar

import click

import tkc
from tkc.arch import DEFAULT_ARCHS, get_arch, parse_arch_list
from tkc.errors import TkcError, UsageError
from tkc.spec import SpecSet, expand, load_specs

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:
    from tkc.build import ArchSummary, BuildOptions


def _root_default(name: str) -> Path:
    # Relative on purpose: spec paths end up in messages and in the generated files, and a
    # wheel must not depend on where the checkout lives.
    return Path(name)


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
    ops = click.get_current_context().meta.get("tkc.ops")  # --ops, where given
    return load_specs(spec_paths or (_root_default("kernel_specs"),), templates, ops)


def _keep_ops(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    ctx.meta["tkc.ops"] = value
    return value


spec_option = click.option("--specs", "spec_paths", multiple=True, type=click.Path(path_type=Path),
                           help="Spec file or folder (repeatable). Default: ./kernel_specs")
_templates = click.option("--templates", type=click.Path(path_type=Path), default=None,
                          help="Kernel templates folder (the specs' template: paths). Default: ./kernels")
_ops = click.option("--ops", type=click.Path(path_type=Path), default=None, expose_value=False, callback=_keep_ops,
                    is_eager=True, help="Op modules folder (the specs' op: paths). Default: ops/ beside the templates")


def templates_option(fn: F) -> F:
    """--templates and --ops: where a spec's template and op paths point."""
    return _templates(_ops(fn))


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
    specs = _specs(spec_paths, templates or _root_default("kernels"))
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
    specs = _specs(spec_paths, templates or _root_default("kernels"))
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

    tdir = templates or _root_default("kernels")
    spec = _specs(spec_paths, tdir).kernel(kernel)
    bad = [v for v in values if "=" not in v]
    if bad:
        raise UsageError(f"--set {bad[0]!r}: write it as KEY=VALUE, e.g. --set dtype=bfloat16; grid keys of "
                         f"{kernel}: {', '.join(spec.grid_keys)}")
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


def _build_options(spec_paths: tuple[Path, ...], templates: Path | None, arch_list: str, jobs: int,
                   build_dir: Path | None, dist_dir: Path | None, nvcc: str | None,
                   line_info: bool = False, kernels: tuple[str, ...] = (), multi_arch: bool = False) -> BuildOptions:
    from tkc.build import BuildOptions

    tdir = templates or _root_default("kernels")
    return BuildOptions(
        specs=_specs(spec_paths, tdir), templates=tdir, build_dir=build_dir or _root_default("build"),
        dist_dir=dist_dir or _root_default("dist"), archs=parse_arch_list(arch_list), jobs=jobs, nvcc=nvcc,
        line_info=line_info, kernels=kernels, multi_arch=multi_arch,
    )


def _build_flags(fn: F) -> F:
    for option in reversed([
        spec_option,
        templates_option,
        click.option("--arch", "arch_list", default=",".join(DEFAULT_ARCHS), show_default=True,
                     help="Comma-separated archs."),
        click.option("-j", "--jobs", default=1, show_default=True, type=click.IntRange(1, 256),
                     help="Variants lowered and compiled in parallel."),
        click.option("--build-dir", type=click.Path(path_type=Path), default=None, help="Default: ./build"),
        click.option("--dist", "dist_dir", type=click.Path(path_type=Path), default=None, help="Default: ./dist"),
        click.option("--nvcc", default=None, envvar="TKC_NVCC",
                     help="nvcc to use: a path, or 'system' for $CUDA_HOME/bin or PATH. Default: nvcc from PyPI. "
                          "[env: TKC_NVCC]"),
        click.option("--lineinfo", "line_info", is_flag=True, default=False,
                     help="Compile with nvcc -lineinfo (source lines for ncu and compute-sanitizer). Such cubins "
                          "record this machine's build and venv folders, so their wheels are not reproducible "
                          "elsewhere; they are cached apart from the default build's."),
        click.option("--multi-arch", "multi_arch", is_flag=True, default=False,
                     help="One wheel holding every --arch's cubins, under the plain version (0.1.0: a package index "
                          "accepts it); its loader picks each device's arch. Default: one wheel per arch "
                          "(0.1.0+sm90), the smallest download."),
    ]):
        fn = option(fn)
    return fn


def _print_summary(summaries: list[ArchSummary], seconds: float, dist: Path) -> None:
    rows = [("arch", "variants", "compiled", "cached", "compile s", "wheel", "size")]
    rows += [(s.arch.name, str(s.variants), str(s.compiled), str(s.cached), f"{s.seconds:.1f}", s.wheel.name,
              _format_bytes(s.wheel_bytes)) for s in summaries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            click.echo("  ".join("-" * w for w in widths))
    missing = {s.native_launch_missing for s in summaries} - {""}
    for reason in sorted(missing):
        click.secho(f"warning: the wheels launch through ctypes (about 2 µs more per call): {reason}", fg="yellow",
                    err=True)
    click.echo(f"done in {seconds:.1f} s; wheels in {dist}")


def _parse_shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard {text!r}: write it as I/N, e.g. 2/3 (shard 2 of 3)") from None
    if count < 1:
        raise UsageError(f"--shard {text!r}: N must be at least 1")
    return index, count


class _LogProgress:
    """Progress for a log that is no terminal (CI): a line every 10% of the variants or every minute, whichever
    comes first, with the elapsed time and an estimate of what is left (click's bar prints only its label)."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label, self.done = total, label, 0
        self.start = self.last = time.monotonic()
        self.mark = 0  # the last tenth reported
        click.echo(f"{label}: {total} variants", file=sys.stderr)

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        tenth = 10 * self.done // max(self.total, 1)
        if self.done < self.total and tenth == self.mark and now - self.last < 60:
            return
        self.mark, self.last = tenth, now
        elapsed = now - self.start
        left = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        click.echo(f"{self.label}: {self.done}/{self.total} ({100 * self.done // max(self.total, 1)}%), "
                   f"{elapsed:.0f} s, about {left:.0f} s left", file=sys.stderr)

    def __enter__(self) -> _LogProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _progress(total: int, label: str) -> Any:
    """click's bar on a terminal, else lines a log can show."""
    if sys.stderr.isatty():
        return click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True)
    return _LogProgress(total, label)


@main.command(name="build")
@_build_flags
@click.option("--kernel", "kernels", multiple=True, metavar="NAME",
              help="Build only this spec kernel's variants (repeatable), into a wheel of just those kernels: "
                   "seconds to rebuild and install while iterating on one kernel.")
@click.option("--shard", default=None, metavar="I/N",
              help="Compile only shard I of N (1-based, deterministic split) into --shard-out; no wheels. "
                   "Then run tkc merge on all N shard folders.")
@click.option("--shard-out", type=click.Path(path_type=Path), default=None,
              help="Folder for the shard's output. Default: ./build/shards/shard-I-of-N")
@_handle_errors
def build_cmd(spec_paths: tuple[Path, ...], templates: Path | None, arch_list: str, jobs: int,
              build_dir: Path | None, dist_dir: Path | None, nvcc: str | None, line_info: bool, multi_arch: bool,
              kernels: tuple[str, ...], shard: str | None, shard_out: Path | None) -> None:
    """Build every spec for every arch: cubins, packages, and one wheel per arch in dist/ (--multi-arch: one
    wheel for all)."""
    from tkc.build import build, build_shard, plan, shard_of

    options = _build_options(spec_paths, templates, arch_list, jobs, build_dir, dist_dir, nvcc, line_info, kernels,
                             multi_arch)
    start = time.perf_counter()
    bar: Any
    if shard is not None:
        index, count = _parse_shard(shard)
        out = shard_out or options.build_dir / "shards" / f"shard-{index}-of-{count}"
        total = len(shard_of(plan(options), index, count))
        with _progress(total, f"shard {index}/{count}") as bar:
            n = build_shard(options, index, count, out, progress=bar.update)
        click.echo(f"shard {index}/{count}: {n} variants in {out} ({time.perf_counter() - start:.1f} s)")
        return
    with _progress(len(plan(options)), "compiling") as bar:
        summaries = build(options, progress=bar.update)
    _print_summary(summaries, time.perf_counter() - start, options.dist_dir)


@main.command(name="merge")
@_build_flags
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True, file_okay=False))
@_handle_errors
def merge_cmd(spec_paths: tuple[Path, ...], templates: Path | None, arch_list: str, jobs: int,
              build_dir: Path | None, dist_dir: Path | None, nvcc: str | None, line_info: bool, multi_arch: bool,
              shards: tuple[Path, ...]) -> None:
    """Assemble the outputs of tkc build --shard I/N into the per-arch wheels, or with --multi-arch the one wheel
    (nothing is compiled)."""
    from tkc.build import merge

    options = _build_options(spec_paths, templates, arch_list, jobs, build_dir, dist_dir, nvcc, line_info,
                             multi_arch=multi_arch)
    start = time.perf_counter()
    summaries = merge(options, list(shards))
    _print_summary(summaries, time.perf_counter() - start, options.dist_dir)


@main.command(name="inspect")
@click.argument("wheel", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_handle_errors
def inspect_cmd(wheel: Path, as_json: bool) -> None:
    """List the kernels, variants and cubins of a wheel and verify every sha256; exit 1 on any mismatch."""
    import dataclasses
    import json

    from tkc.inspect import format_report, inspect_wheel

    report = inspect_wheel(wheel)
    if as_json:
        click.echo(json.dumps({**dataclasses.asdict(report), "ok": report.ok}, indent=1))
    else:
        click.echo(format_report(report))
    if not report.ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
