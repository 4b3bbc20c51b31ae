#!/usr/bin/env bash
# QGIS check of the georeferenced image views (by hand, not in the test suite): PyQGIS (Debian's
# python3-qgis, headless) opens the VRT, TIFF and ENVI views of a raster rioxarray wrote
# (3 bands, EPSG:32633) as raster layers, prints what QGIS makes of each (CRS, extent, bands,
# NoData, sub-layers, the values its Identify tool gives) and renders the VRT to OUT (default
# qgis_check.png). Needs root for apt and FUSE. Usage: tests/manual/qgis_check.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=$(realpath -m "${1:-qgis_check.png}")
PY=${PYTHON:-.venv/bin/python}
/usr/bin/python3 -c "import qgis.core" 2>/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-qgis >/dev/null; }
work=$(mktemp -d)
mnt="$work/mnt"; mkdir "$mnt"
cleanup() {
    fusermount3 -u "$mnt" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
PYTHONPATH=tests "$PY" -W ignore -c "import sys, pathlib; from support.georasters import utm_store; utm_store(pathlib.Path(sys.argv[1]), 3)" "$work"
"$PY" -m zarrfs "$work/utm3.zarr" "$mnt"
QT_QPA_PLATFORM=offscreen /usr/bin/python3 - "$OUT" "$mnt/.zarrfs/gdal/band_data.vrt" "$mnt/.zarrfs/tiff/band_data.tif" "$mnt/.zarrfs/raw/band_data.raw" <<'PYEOF'
import sys
from qgis.core import (QgsApplication, QgsMapRendererSequentialJob, QgsMapSettings, QgsPointXY,
                       QgsProviderRegistry, QgsRaster, QgsRasterLayer)
from qgis.PyQt.QtCore import QSize
from qgis.PyQt.QtGui import QColor

app = QgsApplication([], False)
app.initQgis()
out, paths = sys.argv[1], sys.argv[2:]
for path in paths:
    layer = QgsRasterLayer(path, path.rsplit("/", 1)[-1], "gdal")
    print(path.rsplit("/.zarrfs/", 1)[-1], "valid" if layer.isValid() else "NOT VALID")
    dp = layer.dataProvider()
    centre = layer.extent().center()
    values = dp.identify(QgsPointXY(centre), QgsRaster.IdentifyFormatValue).results()
    print(f"  CRS {layer.crs().authid()} ({layer.crs().description()}); extent {layer.extent().toString(1)}")
    print(f"  {layer.width()} x {layer.height()}, {layer.bandCount()} band(s), NoData {dp.sourceNoDataValue(1)}, "
          f"{len(QgsProviderRegistry.instance().querySublayers(path))} sub-layer(s); Identify at the centre: {dict(values)}")
    if path == paths[0]:
        settings = QgsMapSettings()
        settings.setLayers([layer])
        settings.setDestinationCrs(layer.crs())
        settings.setExtent(layer.extent())
        settings.setOutputSize(QSize(320, 240))
        settings.setBackgroundColor(QColor("white"))
        job = QgsMapRendererSequentialJob(settings)
        job.start()
        job.waitForFinished()
        job.renderedImage().save(out)
    del layer, dp  # before exitQgis: a layer that outlives it crashes the interpreter at exit
app.exitQgis()
PYEOF
echo "rendered $OUT"
