"""daemon/allocator.py: with one heap and freed buffers kept, a buffer one thread frees serves the
next allocation of another thread without a page fault; with glibc's defaults the other thread
faults in every page of it. The kernel's count of a thread's minor faults is the oracle; each
case runs in a process of its own (the settings are the process's)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROBE = textwrap.dedent(
    """
    import ctypes, resource, sys, threading
    from zarrfs.daemon import allocator

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    SIZE = 4 << 20  # an Icechunk chunk's buffer

    def touch_new_buffer_in_a_thread():
        out = []

        def run():
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            block = libc.malloc(SIZE)
            ctypes.memset(block, 1, SIZE)
            out.append((resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before, block))

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        return out[0]

    if sys.argv[1] == "tuned":
        assert allocator.one_heap() and allocator.keep_freed_buffers()
    faults, block = touch_new_buffer_in_a_thread()  # fresh memory either way
    libc.free(block)  # freed by another thread than the one that touched it
    print(touch_new_buffer_in_a_thread()[0])
    """
)


def faults_of_a_second_buffer(mode: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # this clone's zarrfs
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's (elsewhere none are made)")
def test_a_freed_buffer_serves_the_next_one_of_another_thread():
    pages = (4 << 20) // 4096
    assert faults_of_a_second_buffer("default") > pages // 2  # glibc's defaults: fresh memory again
    assert faults_of_a_second_buffer("tuned") < pages // 20  # the freed buffer, already there
