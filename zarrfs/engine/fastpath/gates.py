"""The thresholds that decide when each optional read strategy is tried: one place, a line of why each.

docs/PERFORMANCE.md has the measurements behind these values.
"""

# rows.py: reads smaller than this (random access, 4 KiB at a time) within a row or two of an
# array whose chunks are at hand skip the planner: for them the plan costs more than the copy.
SMALL_READ_BYTES = 64 << 10

# direct.py: smaller reads go through the chunk cache, where one load of a chunk serves many of
# them for less than a system call per chunk piece per read.
DIRECT_MIN_BYTES = 64 << 10
# direct.py: reads cut into smaller pieces than this on average go through the chunk cache
# (few, wide pieces are cheap to copy from cached chunks) ...
PIECE_MIN_BYTES = 4096
# ... unless loading their chunks would copy more than this many times the read (chunks of a
# few columns and full height: a small read of many of them would load the whole array).
LOAD_MAX_RATIO = 16

# bands.py: only reads of a body's size start bands (a peek at a header, random reads take the
# usual path).
BAND_MIN_READ_BYTES = 64 << 10
# bands.py (and rows.py, which leaves such reads to bands): only reads cut into pieces smaller
# than this on average start bands, where planning and copying in the trio thread bound the
# reader; larger pieces gain nothing from moving the copy to another thread. (Reads whose copies
# transpose start bands whatever their pieces: the transposing copy is what bounds them.)
BAND_MAX_PIECE_BYTES = 32 << 10
# bands.py: a transposing stream's bands are whole rows of its chunks when a row takes at most
# this, a reader holding three (the one it reads, the next, and one more) within the budget.
ROW_BAND_MAX_BYTES = 64 << 20

# spares.py: smaller chunks cost few page faults: decoded into fresh memory as before.
SPARE_MIN_BYTES = 256 << 10

# shards.py: a reader's first read, at offset 0, of at least this many bytes starts a sequential
# read of whole shards: the kernel turns a 128 KiB request (the least of `cat` and `cp`) into
# this, while peeks at a header (`head`, `gdalinfo`) send less.
SEQUENTIAL_START_BYTES = 256 << 10
