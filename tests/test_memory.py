"""Which allocator a process runs, where mimalloc lies, and the runs that keep it
(`advisor.memory`, the probe, launch.sh and the exports' launch line)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from advisor.memory import _allocator as allocator
from advisor.memory import mimalloc_library, preloaded_allocator, running_allocator

MAPS = "7f0 r-xp 0 08:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6\n"


def _in_a_fresh_python(preload: str | None) -> str:
    env = {**os.environ, "LD_PRELOAD": preload or ""}
    code = "from advisor.memory import running_allocator as r; print(r())"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_the_allocator_is_read_from_the_libraries_a_process_has_mapped():
    assert running_allocator(MAPS) == "glibc"
    assert running_allocator(MAPS + "7f1 r-xp 0 08:01 13 /opt/lib/libmimalloc.so.3.4\n") == (
        "mimalloc"
    )
    assert running_allocator(MAPS + "7f2 r-xp 0 08:01 14 /usr/lib/libjemalloc.so.2\n") == (
        "jemalloc"
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux's")
def test_a_fresh_process_runs_glibc_and_under_preloaded_mimalloc_says_so():
    assert _in_a_fresh_python(None) == "glibc"
    library = mimalloc_library()
    if library is None:
        pytest.skip("cmeel-mimalloc is not installed")
    assert _in_a_fresh_python(str(library)) == "mimalloc"


def test_only_an_allocator_in_ld_preload_is_kept_for_the_run():
    assert preloaded_allocator("/a/libfoo.so:/b/libmimalloc.so.3") == "/b/libmimalloc.so.3"
    assert preloaded_allocator("/usr/lib/libtcmalloc_minimal.so.4") is not None
    assert preloaded_allocator("/a/libfoo.so") is None
    assert preloaded_allocator("") is None


def test_without_mimalloc_the_helper_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(allocator.sysconfig, "get_path", lambda name: str(tmp_path))
    assert mimalloc_library() is None
    assert allocator.main() == 1
    assert capsys.readouterr().err == "mimalloc is not installed here: pip install cmeel-mimalloc\n"
    library = tmp_path / "cmeel.prefix" / "lib" / "libmimalloc.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    assert allocator.main() == 0
    assert capsys.readouterr().out == f"{library}\n"
