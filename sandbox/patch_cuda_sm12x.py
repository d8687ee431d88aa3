"""patch_cuda_sm12x.py: the GB10 (sm_121a) patch set on a vLLM tree, the eugr set included.

    python3 patch_cuda_sm12x.py /src/vllm

The sandbox build repo ships this file as jovian-judgement/patch_cuda_sm12x.py (sandbox/jovian_sources.py)
and the Dockerfile runs it on the cloned vLLM tree before the wheel is built (runbook: GB10 adaptation
deltas). Every patch is idempotent: it finds its own marker and leaves a patched file alone, so the set
can be (and is) run in full on every build. The patches the tree carries are recorded in
vllm/_sm12x_patches.json, which the image carries and the `sm12x_patch_set_applied` boot gate reads. A
patch whose target file is missing fails the build: the tree moved and the patch must be re-done, not
skipped. Sandbox copy: each patch is its marker line; the real ones rewrite the code around it.
"""

import json
import pathlib
import sys

# name -> (file in the vLLM tree, comment leader). preserve_sm12x_target keeps cmake's arch
# intersection from mapping 12.1a onto the 12.0 kernels.
PATCHES = {
    "preserve_sm12x_target": ("CMakeLists.txt", "#"),
    "sm120_cooperative_topk": ("csrc/cache_kernels.cu", "//"),
    "spark_kv_cache_cleanup": ("vllm/config/cache.py", "#"),
    "b12x_c128a_alignment": ("vllm/model_executor/layers/fused_moe/__init__.py", "#"),
    "flashinfer_swigluoai": ("vllm/model_executor/layers/fused_moe/__init__.py", "#"),
    "speculator_cudagraph_pool": ("vllm/config/__init__.py", "#"),
    "routed_expert_weight_shape": ("vllm/model_executor/models/__init__.py", "#"),
}
RECORD = "vllm/_sm12x_patches.json"


def main(tree: pathlib.Path) -> int:
    applied = []
    for name, (rel, leader) in PATCHES.items():
        target = tree / rel
        if not target.is_file():
            print(f"patch_cuda_sm12x: {name}: {rel} is not in the tree: re-do the patch for this rev", file=sys.stderr)
            return 1
        marker = f"{leader} sm12x-patch: {name}"
        text = target.read_text(encoding="utf-8")
        if marker in text.splitlines():
            print(f"patch_cuda_sm12x: {name}: already applied")
        else:
            sep = "" if not text or text.endswith("\n") else "\n"
            target.write_text(f"{text}{sep}{marker}\n", encoding="utf-8")
            print(f"patch_cuda_sm12x: {name}: applied to {rel}")
        applied.append(name)
    record = {"script": "patch_cuda_sm12x.py", "patches": applied}
    (tree / RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1])))
