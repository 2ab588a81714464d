"""Hostile and malformed specs through ``tkc validate`` and ``tkc build``: each is refused with exit code 2 and a
message naming the file, never a traceback; nothing runs (a marker file the payloads would create stays absent)
and nothing is written (no build or dist folder)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from click.testing import CliRunner

from tkc.cli import main

MARKER = "tkc-fuzz-marker"  # every code payload below would create /tmp/<MARKER>-<n>

BASE = """\
package: {name: fuzz_kernels, version: '0.1.0'}
kernels:
  k:
    module: quant
    template: quant/k.py.j2
    op: quant/k.py
    grid: {n: [1, 2], fmt: [e4m3]}
    constraints: ["n > 0"]
"""


def _payload(i: int) -> str:
    return f"__import__('os').system('touch /tmp/{MARKER}-{i}')"


HOSTILE_STRINGS = [
    _payload(0), f"0 or {_payload(1)} or 1", f'x"""; {_payload(2)}; """', f"x'; {_payload(3)}; '",
    "a\nb", "{{ 7 * 7 }}", "{% raw %}", "../../etc/passwd", "/abs/path.py", "None", "True", "lambda",
    "é", "\u202e", "x" * 5000, " spaced ", "", "1e400", "2048.0.1", "tab\there",
]
# (YAML path to replace, replacement) pairs: every value slot a spec has, each with hostile content.
SLOTS = {
    "grid value": "n: [1, 2]",
    "module": "module: quant",
    "template": "template: quant/k.py.j2",
    "op": "op: quant/k.py",
    "package name": "name: fuzz_kernels",
    "version": "version: '0.1.0'",
}


def _replace(slot: str, value: str) -> str:
    old = SLOTS[slot]
    key = old.split(":")[0]
    quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'
    new = f"n: [1, {quoted}]" if slot == "grid value" else f"{key}: {quoted}"
    return BASE.replace(old, new, 1)


STRUCTURAL = {
    "not a mapping": "- 1\n- 2\n",
    "kernels a list": BASE.replace("kernels:\n  k:", "kernels:\n  - k:"),
    "grid a list": BASE.replace("grid: {n: [1, 2], fmt: [e4m3]}", "grid: [n, fmt]"),
    "nested grid value": BASE.replace("n: [1, 2]", "n: [[1, 2]]"),
    "mapping grid value": BASE.replace("n: [1, 2]", "n: [{a: 1}]"),
    "tagged value": BASE.replace("n: [1, 2]", "n: [!foo 1]"),
    "python tag": BASE.replace("n: [1, 2]", "n: [!!python/name:os.system 1]"),
    "python object tag": BASE.replace("n: [1, 2]", "n: [!!python/object/apply:os.system ['true']]"),
    "deep nesting": BASE.replace("n: [1, 2]", "n: " + "[" * 3000 + "1" + "]" * 3000),
    "billions of points": BASE.replace("grid: {n: [1, 2], fmt: [e4m3]}", "grid: {" + ", ".join(
        f"k{j}: [{', '.join(map(str, range(40)))}]" for j in range(6)) + "}"),
    "huge constraint": BASE.replace('["n > 0"]', '["' + " or ".join(["n == 1"] * 3000) + '"]'),
    "constraint call": BASE.replace('["n > 0"]', f'["{_payload(4)}"]'),
    "constraint attribute": BASE.replace('["n > 0"]', '["n.__class__ == 1"]'),
    "constraint lambda": BASE.replace('["n > 0"]', '["(lambda: 1)() == 1"]'),
    "constraint comprehension": BASE.replace('["n > 0"]', '["[x for x in (1,)] == [1]"]'),
    "constraint walrus": BASE.replace('["n > 0"]', '["(y := 1) == 1"]'),
    # Constraints whose evaluation would run for minutes, exhaust memory or overflow the compiler's stack.
    "constraint power tower": BASE.replace('["n > 0"]', '["9 ** 9 ** 9 > n"]'),
    "constraint repetition": BASE.replace('["n > 0"]', '["(1,) * 10 ** 10 == (n,)"]'),
    "constraint formats a string": BASE.replace('["n > 0"]', '["\'%0999999999d\' % n == fmt"]'),
    "constraint deep unary": BASE.replace('["n > 0"]', '["' + "-" * 1990 + 'n < 0"]'),
    "constraints too long in all": BASE.replace('["n > 0"]', "[" + ", ".join(
        ['"' + " or ".join(["n == 2"] * 199) + '"'] * 11) + "]"),
    "requires call": BASE.replace('constraints: ["n > 0"]', f'requires: ["{_payload(5)} == 0"]'),
    "grid key arch": BASE.replace("n: [1, 2]", "arch: [1, 2]"),
    "grid key variant_id": BASE.replace("n: [1, 2]", "variant_id: [1, 2]"),
    "grid key self": BASE.replace("n: [1, 2]", "self: [1, 2]"),
    "grid key keyword": BASE.replace("n: [1, 2]", "class: [1, 2]"),
    "grid key dunder import": BASE.replace("n: [1, 2]", "__import__: [1, 2]").replace("n > 0", "fmt == 'e4m3'"),
    "infinite float": BASE.replace("n: [1, 2]", "n: [.inf]"),
    "nan float": BASE.replace("n: [1, 2]", "n: [.nan]"),
    "empty archs": BASE.replace("    grid:", "    archs: []\n    grid:"),
    "unknown arch": BASE.replace("    grid:", "    archs: [sm80]\n    grid:"),
    "unknown key": BASE.replace("    grid:", "    gird: {}\n    grid:"),
    "duplicate kernel key": BASE.replace("    grid:", "    module: moe\n    grid:"),
    "empty file": "",
    "only comments": "# nothing\n",
    "yaml error": "package: [unclosed\n",
    "anchors bomb": "a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n",
}
ENCODINGS = {"utf-16": "utf-16", "latin-1 text": "latin-1"}


def _cases() -> list[tuple[str, bytes]]:
    cases = [(f"{slot}: {value[:40]!r}", _replace(slot, value).encode())
             for slot, value in itertools.product(SLOTS, HOSTILE_STRINGS)]
    cases += [(name, text.encode()) for name, text in STRUCTURAL.items()]
    cases += [(name, BASE.replace("fuzz_kernels", "fuzz_kernels  # café").encode(encoding))
              for name, encoding in ENCODINGS.items()]
    cases.append(("binary", bytes(range(1, 256)) * 4))
    return cases


def _project(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "kernels" / "quant").mkdir(parents=True)
    (tmp_path / "kernels" / "quant" / "k.py.j2").write_text("prim_func = None\n")
    (tmp_path / "ops" / "quant").mkdir(parents=True)
    (tmp_path / "ops" / "quant" / "k.py").write_text("def k(x):\n    return x\n")
    return tmp_path / "kernels", tmp_path / "spec.yaml"


CASES = _cases()


def test_the_fuzz_set_is_large() -> None:
    assert len(CASES) >= 100


@pytest.mark.parametrize(("name", "text"), CASES, ids=[name for name, _ in CASES])
def test_hostile_spec_is_refused_cleanly(tmp_path: Path, name: str, text: bytes) -> None:
    templates, spec = _project(tmp_path)
    spec.write_bytes(text)
    before = {p.name for p in Path("/tmp").glob(f"{MARKER}-*")}
    result = CliRunner().invoke(main, ["validate", "--specs", str(spec), "--templates", str(templates)])
    if result.exit_code == 0:
        # Harmless values (a path of words, a module named like a word) may validate; they must then be exactly
        # what they say, which the hostile ones are not: none of those may pass.
        assert not any(s in name for s in ("__import__", '"""', "../", "/abs", "\\n", "{{", "{%")), result.output
        return
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an exception escaping the handler
    assert "Traceback" not in result.output and str(spec) in result.output
    out = tmp_path / "out"
    built = CliRunner().invoke(main, ["build", "--specs", str(spec), "--templates", str(templates),
                                      "--build-dir", str(out / "build"), "--dist", str(out / "dist")])
    assert built.exit_code == 2 and "Traceback" not in built.output
    assert not out.exists()  # nothing half-written
    assert {p.name for p in Path("/tmp").glob(f"{MARKER}-*")} == before  # no payload ran
