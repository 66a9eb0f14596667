"""Builds the StageML torch extension from directories written by `stageml gen cuda`.

    python3 native/build.py GEN_DIR [GEN_DIR ...] [--build-dir DIR] [--verbose]

or, from Python, ``load(gen_dirs)``: compiles native/stageml_ops.cpp together with every generated
``.cu`` (torch.utils.cpp_extension, sm_90a) and loads the library, which registers the
``torch.ops.stageml.*`` custom ops (linear, lora_linear, lora_shrink, lora_expand, residual_moe,
with .out overloads for linear, lora_linear and residual_moe); ``kernels(lib)`` lists the generated
kernels the library registered. Generated translation units keep their kernels in anonymous namespaces and export one uniquely
named entry function each (listed in a registry unit written here), so several generated
directories link into one library; identical units generated for different residuals link once.
"""
import argparse
import glob
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HEADERS = ("stageml_abi.h", "stageml_sm90.cuh")
CUDA_FLAGS = ["-O3", "-gencode=arch=compute_90a,code=sm_90a", "-lineinfo", "--expt-relaxed-constexpr"]


def _write_if_changed(path, text):
    # NOTE: unchanged copies keep their timestamps, so a second load reuses ninja's objects.
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    with open(path, "w") as f:
        f.write(text)


def _registry_unit(entry_fns):
    """The unit that lists every generated unit's entry function (read by stageml_ops.cpp)."""
    decls = "".join(f'extern "C" int32_t {fn}(const StagemlKernel** out, int32_t capacity);\n' for fn in entry_fns)
    items = ", ".join(f"&{fn}" for fn in entry_fns)
    return (f'// Written by native/build.py: the generated units linked into this library.\n#include "stageml_abi.h"\n\n{decls}\n'
            f"namespace {{\nconst StagemlKernelsFn kUnits[] = {{{items}}};\n}}  // namespace\n\n"
            f'extern "C" int32_t stageml_generated_units(const StagemlKernelsFn** units) {{\n  *units = kUnits;\n'
            f"  return {len(entry_fns)};\n}}\n")


def _stage_sources(gen_dirs, build_dir):
    """Copies the generated units into build_dir under unique names (object files are named by
    source basename) and checks that every directory carries the same headers."""
    src_dir = os.path.join(build_dir, "generated")
    os.makedirs(src_dir, exist_ok=True)
    headers = {}
    sources = []
    entry_fns = []
    for d in sorted(os.path.abspath(g) for g in gen_dirs):
        for h in HEADERS:
            with open(os.path.join(d, h)) as f:
                text = f.read()
            if headers.setdefault(h, text) != text:
                raise ValueError(f"{d}/{h} differs from the other directories' copy: regenerate them with one stageml version")
        tag = os.path.basename(os.path.normpath(d))
        for name in sorted(os.listdir(d)):
            if name.endswith(".cu"):
                with open(os.path.join(d, name)) as f:
                    text = f.read()
                fns = re.findall(r'extern "C" int32_t (stageml_kernels_[0-9a-f]{8})\(', text)
                if len(fns) != 1:
                    raise ValueError(f"{d}/{name} exports {len(fns)} entry functions, expected one: regenerate it")
                if fns[0] in entry_fns:
                    continue  # the same unit (same text, same hash) generated for another residual
                entry_fns.append(fns[0])
                dst = os.path.join(src_dir, f"{tag}__{name}")
                _write_if_changed(dst, text)
                sources.append(dst)
    for h, text in headers.items():
        _write_if_changed(os.path.join(src_dir, h), text)
    registry = os.path.join(src_dir, "stageml_registry.cpp")
    _write_if_changed(registry, _registry_unit(entry_fns))
    sources.append(registry)
    if not sources:
        raise ValueError("no generated .cu files in " + ", ".join(gen_dirs))
    return src_dir, sources


def load(gen_dirs, build_dir=None, verbose=False, name="stageml_native"):
    """Builds (or reuses) and loads the extension; returns the library path."""
    import torch
    from torch.utils import cpp_extension

    build_dir = os.path.abspath(build_dir or os.path.join(HERE, "build"))
    os.makedirs(build_dir, exist_ok=True)
    src_dir, sources = _stage_sources(gen_dirs, build_dir)
    # NOTE: the cuda flags already name sm_90a; the arch list only stops torch from adding others.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    cpp_extension.load(
        name=name,
        sources=[os.path.join(HERE, "stageml_ops.cpp")] + sources,
        extra_include_paths=[src_dir],
        extra_cflags=["-O3"],
        extra_cuda_cflags=CUDA_FLAGS,
        # NOTE: name the shared C++ runtime explicitly. Where only the static libstdc++.a is found
        # (seen on the GPU image), the library would carry a second copy of libstdc++'s global
        # state (locales) and crash in the first iostream use; libstdc++.so.6 is the one torch uses.
        extra_ldflags=["-l:libstdc++.so.6"],
        build_directory=build_dir,
        is_python_module=False,
        verbose=verbose,
    )
    if not hasattr(torch.ops.stageml, "lora_linear"):
        raise RuntimeError("the StageML extension loaded but registered no ops")
    # NOTE: with is_python_module=False, load() returns nothing; the library is <name>.so there.
    libs = sorted(glob.glob(os.path.join(build_dir, f"{name}*.so")), key=os.path.getmtime)
    if not libs:
        raise RuntimeError(f"no {name}*.so in {build_dir}")
    return libs[-1]


def kernels(lib):
    """The generated kernels registered in the library at path `lib`, as a list of dicts."""
    import ctypes
    import json

    fn = ctypes.CDLL(lib).stageml_kernels_json
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    size = fn(None, 0)
    buf = ctypes.create_string_buffer(size)
    fn(buf, size)
    return json.loads(buf.value.decode())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gen_dirs", nargs="+")
    ap.add_argument("--build-dir", default=None)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    lib = load(args.gen_dirs, args.build_dir, args.verbose)
    for k in kernels(lib):
        print(k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
