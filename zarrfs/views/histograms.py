"""GDAL's band histograms (`<Histograms>`), as GDAL and QGIS save them into a VRT or an .aux.xml: checked, and kept as text of our own making.

Pure: no I/O. A histogram is numbers only; anything else in the element refuses it.
"""

from __future__ import annotations

import math
from xml.etree import ElementTree

# The children of a HistItem, in the order GDAL writes them.
ITEM_FIELDS = ("HistMin", "HistMax", "BucketCount", "IncludeOutOfRange", "Approximate", "HistCounts")
# Histograms of one band GDAL keeps (one per range and bucket count asked for); more is no histogram.
MAX_ITEMS = 16
# Buckets in one histogram (GDAL's and QGIS's default is 256; a 16-bit one may have 65,536).
MAX_BUCKETS = 1 << 16


def canonical(element: ElementTree.Element) -> str | None:
    """`<Histograms>` as text made from its numbers (None when it holds anything else)."""
    items = list(element)
    if element.attrib or (element.text or "").strip() or not 0 < len(items) <= MAX_ITEMS:
        return None
    lines = ["<Histograms>"]
    for item in items:
        fields = _fields(item)
        if fields is None:
            return None
        lines += ["  <HistItem>"] + [f"    <{k}>{v}</{k}>" for k, v in fields] + ["  </HistItem>"]
    return "\n".join(lines + ["</Histograms>"])


def _fields(item: ElementTree.Element) -> list[tuple[str, str]] | None:
    if item.tag != "HistItem" or item.attrib or [c.tag for c in item] != list(ITEM_FIELDS):
        return None
    text = {c.tag: (c.text or "").strip() for c in item if not len(c) and not c.attrib}
    if len(text) != len(ITEM_FIELDS):
        return None
    try:
        low, high = float(text["HistMin"]), float(text["HistMax"])
        buckets = int(text["BucketCount"])
        counts = [int(c) for c in text["HistCounts"].split("|")]
    except ValueError:
        return None
    if (
        not (math.isfinite(low) and math.isfinite(high))
        or not 0 < buckets <= MAX_BUCKETS
        or len(counts) != buckets
        or any(c < 0 for c in counts)
        or text["IncludeOutOfRange"] not in ("0", "1")
        or text["Approximate"] not in ("0", "1")
    ):
        return None
    return [
        ("HistMin", repr(low)),
        ("HistMax", repr(high)),
        ("BucketCount", str(buckets)),
        ("IncludeOutOfRange", text["IncludeOutOfRange"]),
        ("Approximate", text["Approximate"]),
        ("HistCounts", "|".join(map(str, counts))),
    ]


def lines(text: str, indent: str) -> list[str]:
    """The lines of a kept `<Histograms>` text, indented."""
    return [indent + line for line in text.split("\n")]
