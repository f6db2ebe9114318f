"""`pip install .` (not only the editable install the tests use): the wheel
holds the package, _C and the PTX emulator, and works away from the source
tree."""

import os
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, "build")),
                    reason="needs the build tree scripts/build.sh makes")
def test_wheel_installs_and_runs_outside_the_tree(tmp_path):
    pip = [sys.executable, "-m", "pip"]
    built = subprocess.run(pip + ["wheel", "--no-build-isolation", "--no-deps", "-q",
                                  "-w", str(tmp_path / "wheel"), ROOT],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").iterdir()
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.startswith("tilefuse/_C.") for name in names)
    assert "tilefuse/libtilefuse_emulator.so" in names
    installed = subprocess.run(pip + ["install", "--no-deps", "-q", "--target",
                                      str(tmp_path / "site"), str(wheel)],
                               capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    script = ("import tilefuse, torch\n"
              "assert tilefuse.__file__.startswith(%r), tilefuse.__file__\n"
              "x = torch.randn(3, 16)\n"
              "y = tilefuse.functional.swiglu(x, x)\n"
              "assert torch.allclose(y, torch.nn.functional.silu(x) * x, atol=1e-6)\n"
              % str(tmp_path / "site"))
    # -S: no site hooks, so the editable install cannot shadow the wheel.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path / "site"), sysconfig.get_paths()["purelib"]]),
        TILEFUSE_CACHE_DIR=str(tmp_path / "cache"))
    ran = subprocess.run([sys.executable, "-S", "-c", script], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    # The PTX emulator ships in the wheel and runs the GPU code from there.
    script += ("(launch,) = tilefuse.emulator.last_launches()\n"
               "assert launch['kernel'] == 'swiglu_fwd', launch\n")
    ran = subprocess.run([sys.executable, "-S", "-c", script], cwd=tmp_path,
                         env=dict(env, TILEFUSE_TARGET="emulate"), capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
