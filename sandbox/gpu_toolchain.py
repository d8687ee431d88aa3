"""The GPU toolchain of the sandbox's Jovian base image: `nvcc` and `cuobjdump` stand-ins.

This is the one part of a jovian-judgement build that cannot run here (no CUDA, no GPU), so it is
simulated, and only as far as lockstep and the build look at it. Everything around it is real: the
base is a real image in a real engine (sandbox/base_image.py), tagged with the name the runbook's
Dockerfile builds FROM (``nvidia/cuda:13.2.0-devel-ubuntu24.04``), and the stand-ins sit where that
image has the real tools (``/usr/local/cuda/bin``, on its PATH).

- ``nvcc [-gencode arch=compute_X,code=sm_X]... [-shared] -o OUT INPUT...`` "compiles" each ``.cu``
  input for each ``code=`` target and links objects: OUT is an ELF-headed file that lists its
  cubins. It compiles what it is asked for, like the real one: the arch decision is the build's own
  (vLLM's cmake intersects TORCH_CUDA_ARCH_LIST with its supported archs, so 12.1a becomes sm_120
  unless the GB10 patch ``preserve_sm12x_target`` lists 12.1a; see the vLLM fork's
  ``_build/backend.py``). ``nvcc --version`` prints the release line as CUDA 13.2 does.
- ``cuobjdump --list-elf FILE...`` prints one ``ELF
  file    N: <stem>.N.sm_XX.cubin`` line per cubin,
  the format of NVIDIA's cuobjdump (CUDA Binary Utilities, "cuobjdump --list-elf"); a file without
  device code gets cuobjdump's "does not contain device code" line and exit 255.
"""

from __future__ import annotations

from sandbox.base_image import BaseSpec, ExtraFile

CUDA_BASE_TAG = "nvidia/cuda:13.2.0-devel-ubuntu24.04"
FATBIN_MARK = b"\n#lockstep-sandbox-fatbin v1\n"

NVCC = r'''#!/usr/bin/python3
"""nvcc stand-in (lockstep sandbox, sandbox/gpu_toolchain.py): no CUDA on this machine."""
import json, re, sys

MARK = b"\n#lockstep-sandbox-fatbin v1\n"


def cubins(path):
    data = open(path, "rb").read()
    if MARK not in data:
        return []
    return json.loads(data.split(MARK, 1)[1].decode())


def main(argv):
    if "--version" in argv or "-V" in argv:
        print("nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.2, V13.2.51")
        return 0
    codes, out, inputs, i = [], None, [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("-gencode", "--generate-code"):
            i += 1
            a = "-gencode=" + argv[i]
        if a.startswith(("-gencode=", "--generate-code=")):
            m = re.search(r"code=\[?([^\]]+)\]?", a.split("=", 1)[1])
            codes += [c for c in (m.group(1).split(",") if m else []) if c.startswith("sm_")]
        elif a == "-o":
            i += 1
            out = argv[i]
        elif not a.startswith("-"):
            inputs.append(a)
        i += 1
    if out is None or not inputs:
        print("nvcc fatal   : No input files specified; use option --help for more information", file=sys.stderr)
        return 1
    entries = []
    for src in inputs:
        if src.endswith(".cu"):
            if not codes:
                print("nvcc fatal   : no -gencode target: the build passed no CUDA arch", file=sys.stderr)
                return 1
            entries += [{"arch": c, "source": src.rsplit("/", 1)[-1]} for c in codes]
        else:
            entries += cubins(src)
    with open(out, "wb") as f:
        f.write(b"\x7fELF\x02\x01\x01" + b"\0" * 9 + MARK + json.dumps(entries).encode())
    return 0


sys.exit(main(sys.argv[1:]))
'''  # noqa: E501

CUOBJDUMP = r'''#!/usr/bin/python3
"""cuobjdump stand-in (lockstep sandbox, sandbox/gpu_toolchain.py): lists the cubins nvcc recorded."""
import json, os, sys

MARK = b"\n#lockstep-sandbox-fatbin v1\n"


def main(argv):
    files = [a for a in argv if not a.startswith("-")]
    if "--list-elf" not in argv and "-lelf" not in argv or not files:
        print("cuobjdump: the sandbox stand-in knows --list-elf FILE... only", file=sys.stderr)
        return 1
    status = 0
    for path in files:
        try:
            data = open(path, "rb").read()
        except OSError as exc:
            print(f"cuobjdump fatal   : Could not open input file '{path}': {exc.strerror}", file=sys.stderr)
            return 1
        if MARK not in data:
            print(f"cuobjdump info    : File '{path}' does not contain device code", file=sys.stderr)
            status = 255
            continue
        stem = os.path.basename(path).split(".", 1)[0]
        for n, entry in enumerate(json.loads(data.split(MARK, 1)[1].decode()), 1):
            print(f"ELF file {n:4d}: {stem}.{n}.{entry['arch']}.cubin")
    return status


sys.exit(main(sys.argv[1:]))
'''  # noqa: E501


def jovian_base() -> BaseSpec:
    """The Jovian build node's base: the sandbox Python
    base with the CUDA stand-ins, under the real tag."""
    return BaseSpec(
        tags=(CUDA_BASE_TAG,),
        extra={
            "usr/local/cuda/bin/nvcc": ExtraFile(NVCC.encode()),
            "usr/local/cuda/bin/cuobjdump": ExtraFile(CUOBJDUMP.encode()),
        },
        env=("CUDA_VERSION=13.2.0", "UV_OFFLINE=1", "UV_NO_PROGRESS=1"),
    )
