# lit configuration for tilefuse's compiler tests.
import os

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "tilefuse"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.tilefuse_obj_root)
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "Inputs"]

llvm_config.use_default_substitutions()
# The sanitizer build's tools read their options from the environment.
llvm_config.with_system_environment(["ASAN_OPTIONS", "UBSAN_OPTIONS"])
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.add_tool_substitutions(
    [ToolSubst("tilefuse-opt", unresolved="fatal"),
     ToolSubst("tilefuse-compile", unresolved="fatal")],
    [config.tilefuse_tools_dir])

# Every PTX a test emits goes through ptxas for the chip it targets; a
# rejected file or a spill fails the test (ptxas-check.sh).
cuda_path = os.environ.get("CUDA_PATH", "/usr/local/cuda")
ptxas = os.path.join(cuda_path, "bin", "ptxas")
if not os.path.exists(ptxas):
    lit_config.fatal(f"ptxas not found at {ptxas}: the PTX tests need the CUDA toolkit (set CUDA_PATH)")
config.substitutions.append(
    ("%ptxas-check", f"bash {os.path.join(config.test_source_root, 'ptxas-check.sh')} {ptxas}"))
