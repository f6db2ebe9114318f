"""Compile once, serve from memory and disk; torch.compile sees no graph break."""

import os
import re
import subprocess
import sys

import pytest
import torch

import tilefuse
import tilefuse.functional as TF
from conftest import run_python


def test_first_call_compiles_second_does_not():
    @tilefuse.fusion
    def double_plus_one(x):
        return x * 2.0 + 1.0

    x = torch.randn(3, 24)
    before = tilefuse.compile_count()
    torch.testing.assert_close(double_plus_one(x), x * 2 + 1)
    assert tilefuse.compile_count() == before + 1
    double_plus_one(torch.randn(9, 24))
    assert tilefuse.compile_count() == before + 1


def test_fresh_process_loads_from_disk_without_compiling(tmp_path):
    script = (
        "import torch, tilefuse\n"
        "x = torch.ones(2, 40)\n"
        "y = tilefuse.functional.rms_norm(x, (40,), None, 1e-6)\n"
        "assert torch.allclose(y, torch.ones(2, 40), atol=1e-5)\n"
        "print(tilefuse.compile_count())\n")
    env = dict(TILEFUSE_CACHE_DIR=str(tmp_path), TILEFUSE_LOG="compile")
    first = run_python(script, **env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "1"
    assert "tilefuse: compiled rms_norm_fwd" in first.stderr
    second = run_python(script, **env)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "0"
    assert "compiled" not in second.stderr
    assert any(name.endswith(".tfk") for name in os.listdir(tmp_path))


@tilefuse.fusion
def scale_shift(x, w):
    return x * w + 1.0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_keeps_fused_ops(backend):
    def model(x, w):
        h = TF.rms_norm(x, (x.shape[-1],), w, 1e-6)
        return scale_shift(h, w).sum(-1)

    x, w = torch.randn(4, 32), torch.randn(32)
    eager = model(x, w)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(x, w), eager)


@pytest.mark.parametrize("target, stages, last", [
    ("cpu", ["fuse", "specialized", "tiled", "loops", "llvm-dialect", "llvm"],
     "define void @rms_norm_fwd("),
    ("emulate", ["fuse", "specialized", "tiled", "loops", "nvvm", "llvm", "ptx"],
     ".visible .entry rms_norm_fwd("),
])
def test_dump_writes_every_stage(tmp_path, target, stages, last):
    script = ("import torch, tilefuse\n"
              "tilefuse.functional.rms_norm(torch.randn(2, 24), (24,), None, 1e-6)\n")
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path / "cache"),
                      TILEFUSE_DUMP=str(tmp_path / "dump"), TILEFUSE_TARGET=target)
    assert done.returncode == 0, done.stderr
    files = sorted(os.listdir(tmp_path / "dump"))
    assert [name.split(".")[-2].split("-", 1)[1] for name in files] == stages
    assert all(name.startswith("rms_norm_fwd-") for name in files)
    for name in files[:-1]:
        with open(tmp_path / "dump" / name) as f:
            assert "rms_norm_fwd" in f.read(), name
    with open(tmp_path / "dump" / files[-1]) as f:
        assert last in f.read()


def test_an_unusable_dump_directory_fails_the_compile_and_says_why(tmp_path):
    """TILEFUSE_DUMP naming a file (or a directory it cannot write) was
    ignored without a word: the compile went on and dumped nothing."""
    (tmp_path / "taken").write_text("")
    script = ("import torch, tilefuse\n"
              "tilefuse.functional.rms_norm(torch.randn(2, 24), (24,), None, 1e-6)\n")
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path / "cache"),
                      TILEFUSE_DUMP=str(tmp_path / "taken"))
    assert done.returncode != 0
    assert "rms_norm: compilation failed" in done.stderr, done.stderr
    assert f"cannot write the stages to TILEFUSE_DUMP's '{tmp_path / 'taken'}'" in done.stderr
    # Nothing cached: the next process, dump fixed, compiles and dumps.
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path / "cache"),
                      TILEFUSE_DUMP=str(tmp_path / "dump"))
    assert done.returncode == 0, done.stderr
    stages = sorted(os.listdir(tmp_path / "dump"))
    assert stages
    # A stage's file that cannot be written (here a directory holds its
    # name) fails the compile too; it was skipped without a word.
    os.makedirs(tmp_path / "blocked" / stages[2])
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path / "cache2"),
                      TILEFUSE_DUMP=str(tmp_path / "blocked"))
    assert done.returncode != 0
    assert f"TILEFUSE_DUMP's '{tmp_path / 'blocked' / stages[2]}'" in done.stderr, done.stderr
    # A write that fails once the file is open (a full disk): the stream's
    # pending error ended the process ('LLVM ERROR: IO failure').
    os.makedirs(tmp_path / "full")
    for name in stages:
        os.symlink("/dev/full", tmp_path / "full" / name)
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path / "cache3"),
                      TILEFUSE_DUMP=str(tmp_path / "full"))
    assert "LLVM ERROR" not in done.stderr, done.stderr
    assert (f"TILEFUSE_DUMP's '{tmp_path / 'full' / stages[0]}': No space left on device"
            in done.stderr), done.stderr


def test_dump_file_names_keep_64_characters_of_a_long_kernel_name(tmp_path):
    """A 231-character fusion name made every stage's file name too long
    to create (and the dump silently empty)."""
    script = ("import torch, tilefuse\n"
              "namespace = {}\n"
              "exec('def f' + 'x' * 230 + '(x):\\n    return x * 2\\n', namespace)\n"
              "fusion = tilefuse.fusion(namespace['f' + 'x' * 230])\n"
              "assert torch.equal(fusion(torch.ones(2, 8)), torch.full((2, 8), 2.0))\n")
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path / "cache"),
                      TILEFUSE_DUMP=str(tmp_path / "dump"))
    assert done.returncode == 0, done.stderr
    files = os.listdir(tmp_path / "dump")
    assert len(files) == 6 and all(name.startswith("f" + "x" * 63 + "-") for name in files)


def test_always_compile_bypasses_every_cache(tmp_path):
    script = ("import torch, tilefuse\n"
              "x = torch.randn(2, 24)\n"
              "for _ in range(2):\n"
              "    tilefuse.functional.swiglu(x, x)\n"
              "print(tilefuse.compile_count())\n")
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path), TILEFUSE_ALWAYS_COMPILE="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
    assert not any(name.endswith(".tfk") for name in os.listdir(tmp_path))



def test_threads_racing_on_a_first_call_compile_once():
    import threading

    x = torch.randn(5, 312)
    before = tilefuse.compile_count()
    barrier = threading.Barrier(8)
    results = [None] * 8

    def call(index):
        barrier.wait()
        results[index] = TF.swiglu(x, x)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tilefuse.compile_count() == before + 1
    for result in results:
        torch.testing.assert_close(result, torch.nn.functional.silu(x) * x)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_training_step_with_fused_backward(backend):
    def step(x, w, target, functional):
        h = functional.rms_norm(x, (x.shape[-1],), w, 1e-6)
        loss = functional.cross_entropy(h * torch.sigmoid(h), target, label_smoothing=0.1)
        return loss, torch.autograd.grad(loss, (x, w))

    x = torch.randn(8, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    target = torch.randint(0, 32, (8,))
    compiled = torch.compile(step, backend=backend)
    loss, (dx, dw) = compiled(x, w, target, TF)
    reference, (rdx, rdw) = step(x, w, target, torch.nn.functional)
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(dx, rdx, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(dw, rdw, atol=1e-5, rtol=1e-4)


def test_fusions_first_traced_under_torch_compile():
    """A fusion's first trace inside torch.compile (its fake tensors) leaves
    nothing fake behind: a second such fusion, in a new fake mode, traces
    too (it raised 'Mixing fake modes NYI')."""
    x = torch.randn(4, 8)
    for _ in range(2):
        fresh = tilefuse.fusion(lambda x: x * 2.0 + 1.0)
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: fresh(x), backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), x * 2 + 1)


def test_torch_compile_caches_key_on_tilefuse(monkeypatch):
    """torch.compile's FX-graph and AOTAutograd caches take cache_key_tag:
    importing tilefuse adds its sources' hash (a user's tag kept), so a
    changed op never replays a graph an older tilefuse traced."""
    made = run_python("import torch, tilefuse\nprint(torch.compiler.config.cache_key_tag)",
                      TORCH_COMPILE_CACHE_KEY_TAG="mine")
    assert made.returncode == 0, made.stderr
    tag = made.stdout.strip()
    assert re.fullmatch(r"mine\+tilefuse-[0-9a-f]{16}", tag), tag
    ours = torch.compiler.config.cache_key_tag  # this process's, after its own tag if any
    assert ours.split("+")[-1] == tag.split("+")[-1], ours
    with torch.compiler.config.patch(cache_key_tag=""):
        monkeypatch.setattr(tilefuse._C, "op_source_hash", lambda: "another build")
        tilefuse._tag_torch_compile_caches()
        changed = torch.compiler.config.cache_key_tag
    assert re.fullmatch(r"tilefuse-[0-9a-f]{16}", changed) and changed not in tag


def test_cache_list_and_clear_survive_odd_files_and_remove_only_entries(tmp_path):
    made = run_python("import torch, tilefuse\n"
                      "tilefuse.functional.swiglu(torch.ones(2, 8), torch.ones(2, 8))\n",
                      TILEFUSE_CACHE_DIR=str(tmp_path))
    assert made.returncode == 0, made.stderr
    [entry] = [name for name in os.listdir(tmp_path) if name.endswith(".tfk")]
    # Named like entries, but none is one.
    os.makedirs(tmp_path / ("a" * 64 + ".tfk") / "inside")
    os.mkfifo(tmp_path / ("b" * 64 + ".tfk"))
    os.symlink("/dev/zero", tmp_path / ("c" * 64 + ".tfk"))
    (tmp_path / "notes.tfk").write_text("the user's own file")
    (tmp_path / ("d" * 64 + ".tfk")).write_bytes(b"TILEFUSE-KERNEL 1\nnot a key\nsize=0\n\n")
    odd = sorted(set(os.listdir(tmp_path)) - {entry})

    # A timeout: a FIFO named like an entry once hung `cache list` forever.
    done = subprocess.run(
        [sys.executable, "-c", "from tilefuse.__main__ import main\n"
         "main(['cache', 'list'])\nprint('--')\nmain(['cache', 'clear'])\n"],
        env=dict(os.environ, TILEFUSE_CACHE_DIR=str(tmp_path)),
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed, cleared = done.stdout.split("--\n")
    assert f"{entry[:16]}  n=      8 dtype=f32" in listed
    assert "1 kernels in" in listed and "(5 other files left alone)" in listed
    assert "removed 1 kernels" in cleared
    assert sorted(os.listdir(tmp_path)) == odd


@pytest.mark.parametrize("options, message", [
    (["--steps", "0"], "argument --steps: expected a positive integer, got 0"),
    (["--steps", "ten"], "argument --steps: expected a positive integer, got 'ten'"),
    (["--threads", "-2"], "argument --threads: expected 1 to {cpus}, got -2"),
    (["--threads", str(10**20)], "argument --threads: expected 1 to {cpus}, got"),
    (["--out", "{file}"], "argument --out: '{file}' is not a directory"),
    (["--out", "{file}/sub"], "argument --out: cannot create '{file}/sub' in '{file}'"),
    (["--out", "{tmp}"], "argument --out: '{tmp}/tilefuse-demo.json', where the demo writes, "
                         "is a directory"),
    (["--out", "{tmp}/new", "--steps", "0"], "argument --steps"),
])
def test_demo_refuses_bad_options_before_it_trains(tmp_path, capsys, options, message):
    """`tilefuse demo` checked its options when it used them: --steps 0 and
    an --out it cannot write failed with tracebacks after minutes of training
    (a usage error now, before transformers is imported)."""
    from tilefuse.__main__ import main

    (tmp_path / "file").write_text("")
    (tmp_path / "tilefuse-demo.json").mkdir()
    names = dict(file=tmp_path / "file", tmp=tmp_path, cpus=len(os.sched_getaffinity(0)))
    options = [option.format(**names) for option in options]
    with pytest.raises(SystemExit) as exit:
        main(["demo", *options])
    assert exit.value.code == 2
    assert message.format(**names) in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # nothing created for a refused call
