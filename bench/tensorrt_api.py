"""List the Python API of a TensorRT bindings wheel without loading it.

The wheel's ``tensorrt.so`` needs ``libnvinfer.so.11`` to import, which cannot be installed on
the machines dossier is developed on, so the API is read from the machine code instead. The
binding is pybind11; its registration code passes every Python name as a string constant:

- a method: ``add_class_method(class, NAME, function)``, a property:
  ``def_property_static_impl(NAME, getter, setter, ...)``, either inline or through an out-of-line
  ``class_<T>::def*<...>(NAME, ...)``. The class is the ``self`` parameter (the first argument
  type) of the pybind11 ``initialize<...>::types`` array passed to ``initialize_generic`` just
  before, read from the symbol table (demangled with ``c++filt``), or the ``T`` of ``class_<T>``.
- an enum member: ``enum_<E>::value(NAME, ...)``; an enum: ``enum_<E>::enum_(scope, NAME, ...)``.
- a class: its name string next to the ``typeinfo``/``class_<T>`` symbols of its C++ type.

A linear sweep of ``.text`` (capstone) tracks which string or symbol each register holds
(``lea`` from ``rip``, register moves, stack spills), and reads the name argument at each of
those calls. The result is checked against the binding's own documentation: every ``:ivar
NAME:`` of a class docstring should be a property found on that class (the counts are written
to the listing). Module-level names of the wheel's ``__init__.py`` (``nptype``, ``__version__``)
are read with ``ast``.

Usage (needs ``pip install capstone`` and binutils' ``c++filt``; nothing else)::

    pip download --no-deps tensorrt-cu13-bindings==11.4.0.106 -d wheels/
    python bench/tensorrt_api.py wheels/tensorrt_cu13_bindings-11.4.0.106-*.whl \\
        --out tests/assets/tensorrt-api/

writes ``tests/assets/tensorrt-api/11.4.0.106.json``. The wheels are not kept in the repository.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import struct
import subprocess
import sys
import zipfile
from collections import defaultdict
from pathlib import Path
from typing import Any

LISTING_FORMAT = "dossier-tensorrt-api-1"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CLASS_RECORD = re.compile(r"(?:void )?pybind11::class_<([\w:]+)[,>].*?::(?:dealloc|init_instance)")
"""The functions pybind11 stores in the type record of a ``class_<T>``: they name ``T``."""
_CALLER_SAVED = ("rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11")


# ------------------------------------------------------------------------------------ ELF

class Elf:
    """The sections and symbols of an x86-64 ELF shared object (what this script needs)."""

    def __init__(self, data: bytes) -> None:
        if data[:4] != b"\x7fELF" or data[4] != 2 or struct.unpack_from("<H", data, 18)[0] != 62:
            raise SystemExit("not an x86-64 ELF64 shared object")
        self.data = data
        shoff = struct.unpack_from("<Q", data, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
               for i in range(shnum)]
        names_off = raw[shstrndx][4]
        self.sections = {self.cstr(names_off + s[0]): s for s in raw}
        self.raw_sections = raw
        self.symbols: dict[int, str] = {}
        self.functions: set[int] = set()
        symtab = self.sections.get(".symtab")
        if symtab is None:
            raise SystemExit("the shared object has no .symtab (stripped); cannot list its API")
        strtab_off = raw[symtab[6]][4]
        for i in range(symtab[5] // 24):
            name, info, _, shndx, value, _ = struct.unpack_from("<IBBHQQ", data,
                                                                symtab[4] + i * 24)
            if value and shndx:
                self.symbols.setdefault(value, self.cstr(strtab_off + name))
                if info & 0xF == 2:  # STT_FUNC
                    self.functions.add(value)

    def cstr(self, off: int) -> str:
        return self.data[off:self.data.index(b"\0", off)].decode("utf-8", "replace")

    def section(self, name: str) -> tuple[int, bytes]:
        s = self.sections[name]
        return s[3], self.data[s[4]:s[4] + s[5]]

    def string_at(self, addr: int) -> str | None:
        """The NUL-terminated string at ``addr`` in .rodata. The linker merges a string into the
        tail of a longer one ("Builder" into "IBuilder"), so ``addr`` may be inside another."""
        s = self.sections[".rodata"]
        if not s[3] <= addr < s[3] + s[5]:
            return None
        off = s[4] + addr - s[3]
        end = self.data.find(b"\0", off, off + 65536)
        return None if end < 0 else self.data[off:end].decode("utf-8", "replace")


def demangle(names: list[str]) -> dict[str, str]:
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.split("\n")
    return dict(zip(names, out, strict=False))


def template_args(text: str, head: str) -> list[str]:
    """Top-level template arguments of the first ``head<...>`` in a demangled name."""
    start = text.find(head + "<")
    if start < 0:
        return []
    i, depth, args, cur = start + len(head) + 1, 1, [], []
    while i < len(text) and depth:
        c = text[i]
        if c in "<([":
            depth += 1
        elif c in ">)]":
            depth -= 1
        if depth == 1 and c == ",":
            args.append("".join(cur).strip())
            cur = []
        elif depth:
            cur.append(c)
        i += 1
    args.append("".join(cur).strip())
    return args


def cpp_type(arg: str) -> str:
    """``nvinfer1::IBuilderConfig const*`` -> ``nvinfer1::IBuilderConfig``."""
    return re.sub(r"\b(const|volatile)\b|[&*]", "", arg).strip()


# ---------------------------------------------------------------------------- the sweep

def sweep(elf: Elf) -> list[tuple[str, Any, Any]]:
    """Events in address order: ("member", kind, (cpp_class, name, returns)),
    ("enum", cpp_enum, name), ("value", cpp_enum, name), ("class", name, cpp_type) read at
    ``generic_type::initialize``, ("class?", name, cpp_type) read from nearby constants only
    (used where no "class" event names the type), ("module", name, None)."""
    import capstone
    from capstone import x86_const as x86

    demangled = demangle(sorted(set(elf.symbols.values())))
    parent: dict[str, str] = {}
    for r in "abcd":
        parent.update(dict.fromkeys((f"r{r}x", f"e{r}x", f"{r}x", f"{r}l", f"{r}h"), f"r{r}x"))
    for r in ("si", "di", "bp", "sp"):
        parent.update(dict.fromkeys((f"r{r}", f"e{r}", r, f"{r}l"), f"r{r}"))
    for k in range(8, 16):
        parent.update({f"r{k}{s}": f"r{k}" for s in ("", "d", "w", "b")})
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    md.skipdata = True
    base, code = elf.section(".text")
    regs: dict[str, tuple[str, str] | None] = {}
    slots: dict[tuple[int, int], tuple[str, str] | None] = {}
    last_fn: tuple[str, str] | None = None  # (self C++ type, return C++ type) of the last function
    recent: list[tuple[str, str]] = []  # the last values lea'd (since the last class record)
    events: list[tuple[str, Any, Any]] = []

    def text(reg: str) -> str | None:
        v = regs.get(reg)
        return v[1] if v and v[0] == "S" else None

    for ins in md.disasm(code, base):
        if ins.address in elf.functions:
            regs.clear()
            slots.clear()
            recent.clear()
        if ins.id == 0:
            continue
        ops, mnem = ins.operands, ins.mnemonic
        if mnem == "lea" and ops[1].mem.base == x86.X86_REG_RIP:
            target = ins.address + ins.size + ops[1].mem.disp
            s = elf.string_at(target)
            value: tuple[str, str] | None = None
            if target in elf.symbols and not (s and _IDENT.fullmatch(s)):
                value = ("Y", demangled.get(elf.symbols[target], elf.symbols[target]))
            elif s is not None:
                value = ("S", s)
            regs[parent.get(ins.reg_name(ops[0].reg), "?")] = value
            if value:
                recent = [*recent[-15:], value]
                m = _CLASS_RECORD.match(value[1]) if value[0] == "Y" else None
                name = next((v for k, v in reversed(recent[-4:-1])
                             if k == "S" and _IDENT.fullmatch(v)), None)
                if m and name:  # a class_<T> record being filled in right after NAME
                    events.append(("class?", name, m.group(1)))
            continue
        if mnem == "call":
            callee = ""
            if ops and ops[0].type == x86.X86_OP_IMM and ops[0].imm in elf.symbols:
                callee = demangled.get(elf.symbols[ops[0].imm], "")
            if callee.startswith("pybind11::detail::generic_type::initialize(") and recent:
                # class_<T>(scope, NAME, ...): the record holds NAME and class_<T>'s functions
                for i, (k, v) in enumerate(recent):
                    m = _CLASS_RECORD.match(v) if k == "Y" else None
                    if m:
                        name = next((v2 for k2, v2 in reversed(recent[:i])
                                     if k2 == "S" and _IDENT.fullmatch(v2)), None)
                        if name:
                            events.append(("class", name, m.group(1)))
                        break
                recent = []
            elif callee.startswith("pybind11::cpp_function::initialize_generic"):
                types = regs.get("rcx")
                last_fn = None
                if types and types[0] == "Y" and types[1].endswith("::types"):
                    args = template_args(types[1], "pybind11::cpp_function::initialize")
                    if len(args) >= 3:
                        last_fn = (cpp_type(args[2]), cpp_type(args[1]))
                        init = re.search(r"initimpl::\w+<.*?>::execute<pybind11::class_<([\w:]+)",
                                         types[1])
                        if last_fn[0] == "pybind11::detail::value_and_holder" and init:
                            last_fn = (init.group(1), "")  # a constructor of class_<T>
            elif callee.startswith("pybind11::detail::generic_type::def_property_static_impl"):
                if text("rsi") and last_fn:
                    events.append(("member", "property", (last_fn[0], text("rsi"), last_fn[1])))
                last_fn = None
            elif callee.startswith("pybind11::detail::add_class_method"):
                if text("rsi") and last_fn:
                    events.append(("member", "method", (last_fn[0], text("rsi"), last_fn[1])))
                last_fn = None
            elif callee.startswith("pybind11::module_::add_object"):
                if text("rsi"):
                    events.append(("module", text("rsi"), None))
            elif m := re.match(r"pybind11::enum_<([\w:]+)>::value\(", callee):
                if text("rsi"):
                    events.append(("value", m.group(1), text("rsi")))
            elif m := re.match(r"pybind11::enum_<([\w:]+)>::enum_<", callee):
                if text("rdx"):
                    events.append(("enum", m.group(1), text("rdx")))
            elif m := re.match(r"pybind11::class_<([\w:]+)(?:,.*?)?>::class_<", callee):
                if text("rdx"):  # an out-of-line class_<T>(scope, NAME, ...)
                    events.append(("class", text("rdx"), m.group(1)))
            elif m := re.match(r"pybind11::class_<([\w:]+)(?:,.*?)?>& pybind11::class_<.*?>::"
                               r"(def(?:_\w+)?)<", callee):
                # identical code folding gives one body many class_<T> names: a function made
                # here (last_fn) names its class; otherwise the body is class-specific code
                if text("rsi"):
                    kind = "method" if m.group(2) in ("def", "def_static") else "property"
                    cls, ret = last_fn or (m.group(1), None)
                    events.append(("member", kind, (cls, text("rsi"), ret)))
                last_fn = None
            for r in _CALLER_SAVED:
                regs.pop(r, None)
            continue
        if mnem == "mov" and len(ops) == 2:
            a, b = ops
            stack = (x86.X86_REG_RSP, x86.X86_REG_RBP)
            if a.type == x86.X86_OP_REG and b.type == x86.X86_OP_REG:
                regs[parent.get(ins.reg_name(a.reg), "?")] = regs.get(
                    parent.get(ins.reg_name(b.reg), "?"))
                continue
            if a.type == x86.X86_OP_MEM and b.type == x86.X86_OP_REG \
                    and a.mem.base in stack and not a.mem.index:
                slots[(a.mem.base, a.mem.disp)] = regs.get(parent.get(ins.reg_name(b.reg), "?"))
                continue
            if a.type == x86.X86_OP_REG and b.type == x86.X86_OP_MEM \
                    and b.mem.base in stack and not b.mem.index:
                regs[parent.get(ins.reg_name(a.reg), "?")] = slots.get((b.mem.base, b.mem.disp))
                continue
        try:
            written = ins.regs_access()[1]
        except capstone.CsError:
            written = []
        for r in written:
            regs.pop(parent.get(ins.reg_name(r), "?"), None)
    return events


# -------------------------------------------------------------------------- the listing

def python_names(init_source: str) -> list[str]:
    """Module-level names the wheel's ``__init__.py`` defines itself."""
    names: set[str] = set()
    for node in ast.parse(init_source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return sorted(n for n in names if not n.startswith("_") or n == "__version__")


def listing(wheel: Path) -> dict[str, Any]:
    with zipfile.ZipFile(wheel) as zf:
        so_name = next(n for n in zf.namelist() if n.endswith("/tensorrt.so"))
        init_name = so_name.rsplit("/", 1)[0] + "/__init__.py"
        so, init = zf.read(so_name), zf.read(init_name).decode()
    version = re.search(r'^__version__ = "([^"]+)"', init, re.M)
    if not version:
        raise SystemExit(f"{wheel.name}: its __init__.py sets no __version__")
    events = sweep(Elf(so))

    py_name: dict[str, str] = {}  # C++ type -> Python name
    def norm(cpp: str) -> str:  # TensorRT's inline ABI namespace is not part of a name
        return cpp.replace("::v_1_0::", "::")

    for kind, a, b in events:
        if kind == "class" and norm(b) not in py_name:
            py_name[norm(b)] = a
        elif kind == "enum":
            py_name[norm(a)] = b
    for kind, a, b in events:  # the looser reading only where the exact one found nothing
        if kind == "class?" and norm(b) not in py_name:
            py_name[norm(b)] = a

    def qualified(cpp: str) -> str | None:
        """Python name of a C++ type; nested types as ``Outer.Inner``."""
        cpp = norm(cpp)
        if cpp not in py_name:
            return None
        outer = cpp.rsplit("::", 1)[0]
        if outer in py_name and py_name[outer] != py_name[cpp]:
            return f"{qualified(outer)}.{py_name[cpp]}"
        return py_name[cpp]

    classes: dict[str, dict[str, str]] = defaultdict(dict)
    enums: dict[str, list[str]] = defaultdict(list)
    returns: dict[str, str] = {}
    module: set[str] = set(python_names(init))
    unplaced = 0
    for kind, a, b in events:
        if kind == "member":
            cls, name, ret = b
            owner = qualified(cls)
            if owner is None:
                unplaced += 1
                continue
            current = classes[owner].get(name)
            classes[owner][name] = "property" if "property" in (a, current) else a
            target = qualified(ret) if ret else None
            if target and a == "method" and name != "__init__":
                returns[f"{owner}.{name}"] = target
        elif kind == "value":
            owner = qualified(a)
            if owner is None:
                unplaced += 1
            elif b not in enums[owner]:
                enums[owner].append(b)
        elif kind == "module":
            module.add(a)
    for cpp in py_name:
        q = qualified(cpp)
        if q and "." not in q and (q in classes or q in enums):
            module.add(q)
    return {
        "format": LISTING_FORMAT,
        "tensorrt_version": version.group(1),
        "wheel": wheel.name,
        "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "tensorrt_so_sha256": hashlib.sha256(so).hexdigest(),
        "generator": "bench/tensorrt_api.py",
        "unplaced_names": unplaced,
        "ivar_check": ivar_check(so, classes),
        "module": sorted(module),
        "classes": {k: dict(sorted(v.items())) for k, v in sorted(classes.items())},
        "enums": {k: sorted(v) for k, v in sorted(enums.items())},
        "returns": dict(sorted(returns.items())),
    }


def ivar_check(so: bytes, classes: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Compare the ``:ivar NAME:`` entries of class docstrings with the properties found.

    A class docstring is recognised by the classes it names (``:class:`X```) being unknown, so
    this matches a docstring to a class only through ``:ivar`` names: the class that holds
    most of a docstring's ``:ivar`` names is its class. Reported: how many ``:ivar`` names are
    properties of that class."""
    documented = found = 0
    missing: list[str] = []
    for raw in re.findall(rb"[^\0]*:ivar [^\0]*", so):
        names = re.findall(r":ivar (\w+):", raw.decode("utf-8", "replace"))
        if not names:
            continue
        best = max(classes, key=lambda c: sum(n in classes[c] for n in names))
        documented += len(names)
        hit = [n for n in names if n in classes[best]]
        found += len(hit)
        missing += [f"{best}.{n}" for n in names if n not in classes[best]]
    return {"documented_ivars": documented, "found_on_class": found,
            "missing": sorted(set(missing))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("wheels", nargs="+", type=Path, help="tensorrt-cu1X-bindings wheels")
    parser.add_argument("--out", type=Path, required=True, help="folder for VERSION.json")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for wheel in args.wheels:
        data = listing(wheel)
        path = args.out / f"{data['tensorrt_version']}.json"
        path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
        n = sum(len(v) for v in data["classes"].values())
        print(f"{path}: {len(data['classes'])} classes, {n} members, {len(data['enums'])} enums, "
              f"ivars {data['ivar_check']['found_on_class']}/"
              f"{data['ivar_check']['documented_ivars']}, unplaced {data['unplaced_names']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
