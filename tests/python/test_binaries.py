"""The built libraries stay within the floor docs/serving.md states: glibc 2.34 and libstdc++'s
GLIBCXX_3.4.29. The wheel test (test_packaging, an environment test) sees a breach only through
auditwheel's tag; this reads each symbol's version from the build tree, so a new libm or libc call
(glibc 2.35's hypot, say) fails in the quick suite and is named."""

import re

import pytest
from elftools.elf.elffile import ELFFile

from opbridge._library.files import builtin_library_dir

FLOOR = {"GLIBC": (2, 34), "GLIBCXX": (3, 4, 29)}


def versioned_imports(path):
    """(symbol, library, version) for every undefined dynamic symbol bound to a version."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        needed = {}
        for verneed, aux in elf.get_section_by_name(".gnu.version_r").iter_versions():
            for a in aux:
                needed[a["vna_other"]] = (verneed.name, a.name)
        versions = elf.get_section_by_name(".gnu.version")
        for i, sym in enumerate(elf.get_section_by_name(".dynsym").iter_symbols()):
            ndx = versions.get_symbol(i)["ndx"]
            if sym["st_shndx"] == "SHN_UNDEF" and ndx in needed:
                yield (sym.name, *needed[ndx])


def above_floor(version):
    m = re.fullmatch(r"(GLIBCXX|GLIBC)_([\d.]+)", version)
    if not m:
        return False
    return tuple(int(p) for p in m.group(2).split(".")) > FLOOR[m.group(1)]


LIBRARIES = sorted(builtin_library_dir().glob("libopbridge_*.so"))


@pytest.mark.parametrize("path", LIBRARIES, ids=lambda p: p.name)
def test_library_needs_no_symbol_above_the_stated_floor(path):
    imports = list(versioned_imports(path))
    assert any(v.startswith("GLIBC_") for _, _, v in imports), "no versioned glibc symbol read"
    above = sorted(f"{name}@{version} ({lib})" for name, lib, version in imports if above_floor(version))
    assert not above, f"{path.name} needs symbols above glibc 2.34 / GLIBCXX_3.4.29: {above}"


def test_both_libraries_are_checked():
    assert {p.name for p in LIBRARIES} >= {"libopbridge_torch.so", "libopbridge_ort.so"}
