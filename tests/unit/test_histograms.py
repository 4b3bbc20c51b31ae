"""GDAL's band histograms as the image views keep them (zarrfs.views.histograms): what GDAL 3.6 wrote is kept
with its numbers, anything else refused."""

from __future__ import annotations

from xml.etree import ElementTree

import pytest

from zarrfs.views import histograms

# As gdalinfo -hist (GDAL 3.6) saved it into an .aux.xml.
GDAL_WROTE = """<Histograms>
      <HistItem>
        <HistMin>0.5208333333333333</HistMin>
        <HistMax>47.47916666666666</HistMax>
        <BucketCount>4</BucketCount>
        <IncludeOutOfRange>0</IncludeOutOfRange>
        <Approximate>0</Approximate>
        <HistCounts>1|0|12|7</HistCounts>
      </HistItem>
    </Histograms>"""


def numbers(text: str) -> list[dict[str, str]]:
    return [{c.tag: c.text for c in item} for item in ElementTree.fromstring(text)]


def test_what_gdal_wrote_is_kept_with_its_numbers():
    kept = histograms.canonical(ElementTree.fromstring(GDAL_WROTE))
    assert numbers(kept) == numbers(GDAL_WROTE)
    assert histograms.lines(kept, "  ")[0] == "  <Histograms>"


@pytest.mark.parametrize(
    "change",
    [
        ("<BucketCount>4</BucketCount>", "<BucketCount>5</BucketCount>"),  # counts of another number
        ("1|0|12|7", "1|0|x|7"),
        ("1|0|12|7", "1|0|-12|7"),
        ("<HistMin>0.5208333333333333</HistMin>", "<HistMin>nan</HistMin>"),
        ("<Approximate>0</Approximate>", "<Approximate>2</Approximate>"),
        ("<Approximate>0</Approximate>", "<Approximate>0</Approximate><Extra/>"),
        ("<HistItem>", '<HistItem a="1">'),
        ("<HistMin>0.5208333333333333</HistMin>", "<HistMin>0.52<b/></HistMin>"),
        ("<Histograms>", "<Histograms>text"),
    ],
)
def test_anything_but_numbers_is_refused(change):
    assert histograms.canonical(ElementTree.fromstring(GDAL_WROTE.replace(*change))) is None
