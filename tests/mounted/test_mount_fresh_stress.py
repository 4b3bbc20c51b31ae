"""Freshness under load, the short version of benchmarks/stress_fresh.py: after `metadata_ttl`, no
read of a remote mount returns bytes of a chunk the store no longer holds, with or without the disk cache."""

from __future__ import annotations

from benchmarks import stress_fresh as stress

TTL_S = 1.0
SECONDS = 25.0


def test_reads_after_the_ttl_hold_the_rewritten_chunks(s3, tmp_path, mount):
    endpoint, _ = s3
    layout = stress.Layout((1024, 1024), (256, 256))
    stress.put_array(endpoint, layout)
    source = f"s3://{stress.BUCKET}/{stress.NAME}"
    mounts = {
        "disk-cache": mount(source, *stress.mount_options(endpoint, TTL_S, tmp_path / "disk-cache")),
        "no-disk": mount(source, *stress.mount_options(endpoint, TTL_S, None)),
    }
    work = tmp_path / "work"
    work.mkdir()
    failures, counts, errors = stress.run(endpoint, mounts, layout, work, SECONDS, TTL_S, busy=1, pause_s=0.5)
    text = stress.report(failures, counts, errors, stress.rewrites(work / "writes.log"))
    assert not failures and not errors, text
    for label in mounts:  # every reader read, and reads began after rewrites were due
        for kind in stress.KINDS:
            assert counts.get((label, kind), [0])[0] > 0, text
    assert sum(n[1] for n in counts.values()) > 0, text
