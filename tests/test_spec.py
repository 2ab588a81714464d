"""Spec parsing and every class of validation error (no TileLang, no nvcc)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tkc.errors import SpecError
from tkc.spec import expand, load_specs

REPO = Path(__file__).resolve().parent.parent

GOOD = """\
package:
  name: my_kernels
  version: 1.2.3
kernels:
  per_token_cast:
    module: quant
    template: quant/per_token_cast.py.j2
    op: quant/per_token_cast.py
    archs: [sm90]
    grid:
      in_dtype: [bfloat16, float32]
      hidden: [2048, 7168]
      fmt: [e4m3, e2m1]
      npc: [32, 128]
      round_sf: [false, true]
    constraints:
      - "fmt != 'e2m1' or npc == 32"
"""


@pytest.fixture
def templates(tmp_path: Path) -> Path:
    """A project's kernels/ folder, with its ops/ beside it (where load_specs looks for op paths)."""
    root = tmp_path / "kernels"
    (root / "quant").mkdir(parents=True)
    (root / "quant" / "per_token_cast.py.j2").write_text("prim_func = None\n")
    (tmp_path / "ops" / "quant").mkdir(parents=True)
    (tmp_path / "ops" / "quant" / "per_token_cast.py").write_text("def per_token_cast(x):\n    return x\n")
    return root


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / "specs" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path: Path, templates: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_specs([path], templates)
    assert info.value.exit_code == 2
    return str(info.value)


def test_good_spec_parses_into_frozen_dataclasses(tmp_path: Path, templates: Path) -> None:
    specs = load_specs([write(tmp_path, GOOD)], templates)
    assert specs.package.name == "my_kernels" and specs.package.version == "1.2.3"
    (k,) = specs.kernels
    assert k.name == "per_token_cast" and k.module == "quant" and k.archs == ("sm90",)
    assert k.grid_keys == ("in_dtype", "hidden", "fmt", "npc", "round_sf")
    assert k.line == 5
    with pytest.raises(AttributeError):
        k.name = "other"  # type: ignore[misc]
    variants = expand(k)
    # 2 dtypes x 2 H x (e4m3: 2 npc + e2m1: 1 npc) x 2 round_sf
    assert len(variants) == 2 * 2 * 3 * 2
    assert all(v.param_dict["npc"] == 32 for v in variants if v.param_dict["fmt"] == "e2m1")
    ids = [v.id for v in variants]
    assert len(set(ids)) == len(ids)
    assert ids == [v.id for v in expand(k)]  # deterministic


def test_shipped_specs_are_valid() -> None:
    specs = load_specs([REPO / "kernel_specs"], REPO / "kernels")
    names = {k.name for k in specs.kernels}
    assert {"per_token_cast", "batched_transpose"} <= names
    assert specs.package.name == "tile_kernels_aot"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("  per_token_cast:\n    module: quant", "  per_token_cast:\n    modul: quant",
         "kernels.per_token_cast.modul: unknown key; valid keys: module"),
        ("fmt: [e4m3, e2m1]", "fmt: [e4m3, e4m4]", "bad value 'e4m4'; valid choices: e4m3, e2m1, e5m6 (did you mean 'e4m3'?)"),
        ("in_dtype: [bfloat16, float32]", "in_dtype: [bfloat16, bfloat61]", "bad value 'bfloat61'"),
        ("archs: [sm90]", "archs: [sm91]", "kernels.per_token_cast.archs: bad value 'sm91'; valid choices: sm90, sm100"),
        ("module: quant", "module: 2quant", "bad value '2quant'; a module is the package's submodule users import"),
        ("    op: quant/per_token_cast.py\n", "    op: quant/per_token_cast.py\n    requires: ['hidden % 64']\n",
         "kernels.per_token_cast.requires: 'hidden % 64': not one comparison 'expression == expression'"),
        ("    op: quant/per_token_cast.py\n", "    op: quant/per_token_cast.py\n    requires: ['f(n) == 0']\n",
         "'f(n)': not a sum, product, floor quotient, max or min of sizes and integers"),
        ("    op: quant/per_token_cast.py\n", "    op: quant/per_token_cast.py\n    requires: ['n = 1']\n",
         "kernels.per_token_cast.requires: invalid syntax"),
        ("module: quant", "module: _runtime", "a Python identifier that does not start with '_'"),
        ("module: quant", "module: errors", "is not 'cubins' or 'errors'"),
        ("module: quant", "module: lambda", "bad value 'lambda'"),
        ("template: quant/per_token_cast.py.j2", "template: quant/missing.py.j2",
         "'quant/missing.py.j2' does not exist under"),
        ("op: quant/per_token_cast.py", "op: quant/per_token_cast.txt", "should end in .py"),
        ("    op: quant/per_token_cast.py\n", "", "kernels.per_token_cast.op: missing required key"),
        ("\"fmt != 'e2m1' or npc == 32\"", "\"fmt != 'e2m1' or npcs == 32\"",
         "names 'npcs', which is not a grid key; grid keys: in_dtype, hidden, fmt, npc, round_sf (did you mean 'npc'?)"),
        ("\"fmt != 'e2m1' or npc == 32\"", "\"__import__('os').system('true')\"", "uses Call"),
        ("\"fmt != 'e2m1' or npc == 32\"", "\"fmt == \"", "is not a Python expression"),
        ("\"fmt != 'e2m1' or npc == 32\"", "\"npc == 7\"", "the constraints exclude every grid point"),
        ("hidden: [2048, 7168]", "hidden: [2048, 2048]", "value 2048 is listed twice"),
        ("hidden: [2048, 7168]", "hidden: []", "empty list"),
        ("hidden: [2048, 7168]", "hidden: [{a: 1}]", "expected scalars"),
        ("version: 1.2.3", "version: one", "'one' is not a PEP 440 version"),
        ("name: my_kernels", "name: my-kernels", "is not a Python package name"),
        ("package:", "packages:", "(top level).packages: unknown key; valid keys: package, kernels (did you mean 'package'?)"),
        # Values reach the rendered module and the generated launchers: words and finite numbers only.
        ("hidden: [2048, 7168]", "hidden: [\"0 or __import__('os').system('touch /tmp/x') or 2048\"]",
         "a string value is pasted into the template, so it must be a word"),
        ("hidden: [2048, 7168]", "hidden: ['x\"\"\"; import os; \"\"\"']", "must be a word"),
        ("hidden: [2048, 7168]", "hidden: [None]", "must be a word (letters, digits, '_', not a Python keyword)"),
        ("hidden: [2048, 7168]", "hidden: [.inf]", "bad value inf; give a finite number"),
        ("archs: [sm90]", "archs: []", "kernels.per_token_cast.archs: empty list; name the archs to build"),
        ("hidden: [2048, 7168]", "hidden: [-2048]", "bad value -2048; grid numbers are sizes, counts and factors"),
        ("hidden: [2048, 7168]", "hidden: [2048, true]", "bad value True: a bool among int values"),
        ("hidden: [2048, 7168]", "hidden: [2048, 7168.0]", "a float among int values; give every value of a key one type"),
        # What a key means, from its name: sizes are ints below 2^31, flags bools.
        ("hidden: [2048, 7168]", "hidden: [2048.5]", "bad value 2048.5; hidden is a size or count: give an int"),
        ("hidden: [2048, 7168]", "hidden: [true]", "bad value True; hidden is a size or count"),
        ("hidden: [2048, 7168]", "hidden: [4294967296]", "passed to the kernels as int32: give a value below 2^31"),
        ("round_sf: [false, true]", "round_sf: [0, 1]", "bad value 0; round_sf is a flag: give true or false"),
        # Paths stay in their folders.
        ("op: quant/per_token_cast.py", "op: /etc/evil.py", "'/etc/evil.py' leaves"),
        ("op: quant/per_token_cast.py", "op: ../ops/quant/per_token_cast.py", "without '..'"),
        ("template: quant/per_token_cast.py.j2", "template: quant/../quant/per_token_cast.py.j2", "leaves"),
        ("template: quant/per_token_cast.py.j2", "template: \"quant/x\\\"y.py.j2\"", "give a relative path of words"),
    ],
)
def test_validation_errors_name_file_line_key_value_and_fix(tmp_path: Path, templates: Path, old: str, new: str,
                                                            expected: str) -> None:
    assert old in GOOD
    message = error_of(tmp_path, templates, GOOD.replace(old, new, 1))
    assert expected in message
    assert "spec.yaml:" in message  # file and line


def test_error_reports_the_line_of_the_bad_value(tmp_path: Path, templates: Path) -> None:
    message = error_of(tmp_path, templates, GOOD.replace("fmt: [e4m3, e2m1]", "fmt: [e4m3, e2m7]"))
    line = GOOD.splitlines().index("      fmt: [e4m3, e2m1]") + 1
    assert f"spec.yaml:{line}: kernels.per_token_cast.grid.fmt" in message


def test_all_problems_are_reported_at_once(tmp_path: Path, templates: Path) -> None:
    text = GOOD.replace("fmt: [e4m3, e2m1]", "fmt: [e4m9]").replace("archs: [sm90]", "archs: [sm42]")
    message = error_of(tmp_path, templates, text)
    assert "e4m9" in message and "sm42" in message


def test_invalid_yaml_and_empty_file(tmp_path: Path, templates: Path) -> None:
    assert "not valid YAML" in error_of(tmp_path, templates, "kernels: [unclosed\n")
    assert "empty spec file" in error_of(tmp_path, templates, "")


def test_duplicate_kernel_across_files_and_package_mismatch(tmp_path: Path, templates: Path) -> None:
    write(tmp_path, GOOD, "a.yaml")
    write(tmp_path, GOOD.replace("version: 1.2.3", "version: 2.0.0"), "b.yaml")
    with pytest.raises(SpecError) as info:
        load_specs([tmp_path / "specs"], templates)
    message = str(info.value)
    assert "already declared at" in message and "differs from my_kernels 1.2.3" in message


def test_duplicate_key_is_an_error(tmp_path: Path, templates: Path) -> None:
    text = GOOD.replace("    module: quant\n", "    module: quant\n    module: quant\n")
    assert "kernels.per_token_cast.module: duplicate key" in error_of(tmp_path, templates, text)


def test_no_spec_files(tmp_path: Path, templates: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match="no spec files found"):
        load_specs([tmp_path / "empty"], templates)


def test_a_module_may_be_any_identifier(tmp_path: Path, templates: Path) -> None:
    # tkc is a compiler, not a fixed catalog: a user's package names its own modules.
    path = tmp_path / "k.yaml"
    path.write_text(GOOD.replace("module: quant", "module: linalg"))
    (kernel,) = load_specs([path], templates).kernels
    assert kernel.module == "linalg"


def test_op_paths_resolve_under_the_ops_folder(tmp_path: Path, templates: Path) -> None:
    # Build-time kernels and run-time ops live in folders of their own: kernels/ and ops/ beside it.
    path = write(tmp_path, GOOD)
    assert load_specs([path], templates).ops == tmp_path / "ops"
    elsewhere = tmp_path / "my_ops"
    (elsewhere / "quant").mkdir(parents=True)
    (elsewhere / "quant" / "per_token_cast.py").write_text("def per_token_cast(x):\n    return x\n")
    assert load_specs([path], templates, elsewhere).ops == elsewhere
    (tmp_path / "ops" / "quant" / "per_token_cast.py").unlink()
    with pytest.raises(SpecError, match=f"'quant/per_token_cast.py' does not exist under {tmp_path / 'ops'}"):
        load_specs([path], templates)


def test_a_template_or_op_symlinked_out_of_its_folder_is_refused(tmp_path: Path, templates: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "evil.py.j2").write_text("prim_func = None\n")
    (templates / "quant" / "evil.py.j2").symlink_to(outside / "evil.py.j2")
    message = error_of(tmp_path, templates, GOOD.replace("quant/per_token_cast.py.j2", "quant/evil.py.j2"))
    assert "kernels.per_token_cast.template: 'quant/evil.py.j2' leaves" in message and "symlink" in message


@pytest.mark.parametrize("name", ['spec".yaml', "spec\nimport os.yaml", "spec\\x.yaml"], ids=["quote", "newline", "backslash"])
def test_a_spec_file_whose_path_could_break_generated_code_is_refused(tmp_path: Path, templates: Path,
                                                                      name: str) -> None:
    path = write(tmp_path, GOOD, name=name)
    with pytest.raises(SpecError, match="may not hold quotes, backslashes or control characters; rename") as info:
        load_specs([path], templates)
    assert info.value.exit_code == 2


CONSTRAINT = "\"fmt != 'e2m1' or npc == 32\""


@pytest.mark.parametrize(
    ("constraint", "expected"),
    [
        ("npc ** 99999999999 > 0", "'npc ** 99999999999 > 0' fails for {"),
        ("9 ** 9 ** 9 > 0", "9 ** 387420489 is an integer of more than 4096 bits"),
        ("hidden * 2 ** 4000 * 2 ** 4000 > 0", "it computes an integer of more than 4096 bits"),
        ("(1,) * 10 ** 10 == (1,)", "it repeats a tuple to more than 10000 items"),
        ("'%0999999999d' % npc == fmt", "'%' formats a string; constraints compare values"),
        ("-" * 1990 + "npc < 0", "nests 1994 levels deep; at most 100: split it into several constraints"),
    ],
    ids=["power", "tower", "product", "repetition", "format", "nesting"],
)
def test_what_a_constraint_may_compute_is_bounded(tmp_path: Path, templates: Path, constraint: str,
                                                  expected: str) -> None:
    """A constraint that would run for minutes, exhaust memory or overflow the compiler's stack is a SpecError
    naming the file and the constraint, at once."""
    import json
    import time

    start = time.perf_counter()
    message = error_of(tmp_path, templates, GOOD.replace(CONSTRAINT, json.dumps(constraint)))
    assert time.perf_counter() - start < 5
    assert "spec.yaml:" in message and "kernels.per_token_cast.constraints" in message and expected in message


def test_a_kernels_constraints_are_capped_in_all(tmp_path: Path, templates: Path) -> None:
    # Each is evaluated at every grid point: 11 constraints of 1990 characters are too many.
    long = " or ".join(["npc == 32"] * 150)[:1990].rsplit(" or ", 1)[0]
    text = GOOD.replace(f"      - {CONSTRAINT}\n", "".join(f'      - "{long}"\n' for _ in range(11)))
    message = error_of(tmp_path, templates, text)
    assert "kernels.per_token_cast.constraints: constraints of" in message and "at most 20000 per kernel" in message
    # The guarded operators still compute what small constraints ask.
    fine = GOOD.replace(CONSTRAINT, "\"npc % 32 == 0 and npc ** 2 * 2 >= 2048 and (1, 2) * 2 == (1, 2, 1, 2)\"")
    (kernel,) = load_specs([write(tmp_path, fine)], templates).kernels
    assert {v.param_dict["npc"] for v in expand(kernel)} == {32, 128}
