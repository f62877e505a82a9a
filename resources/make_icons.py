"""Render resources/icons/switchyard.svg into the PNG sizes and the .ico/.icns containers installers use.

Run once after editing the SVG (`.venv/bin/python resources/make_icons.py`); the outputs are committed so
a build needs no image tooling. Qt's SVG renderer does the drawing; the .ico and .icns files are plain
containers of PNG images, written here by hand so no Pillow or iconutil is needed.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "icons"
PNG_SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)
# icns element types that hold PNG data, by pixel size
ICNS_TYPES = {16: b"icp4", 32: b"icp5", 64: b"icp6", 128: b"ic07", 256: b"ic08", 512: b"ic09"}


def render_pngs(svg: Path, out: Path) -> dict[int, bytes]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg}: not a valid SVG")
    pngs: dict[int, bytes] = {}
    for px in PNG_SIZES:
        img = QImage(px, px, QImage.Format.Format_ARGB32)
        img.fill(Qt.GlobalColor.transparent)
        painter = QPainter(img)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        data = QByteArray()
        buf = QBuffer(data)
        buf.open(QIODevice.OpenModeFlag.WriteOnly)
        img.save(buf, "PNG")
        pngs[px] = bytes(data.data())
        (out / f"switchyard-{px}.png").write_bytes(pngs[px])
    return pngs


def ico_bytes(pngs: dict[int, bytes]) -> bytes:
    """ICONDIR + one ICONDIRENTRY per size, each image stored as PNG (Windows Vista and later read it)."""
    sizes = [s for s in ICO_SIZES if s in pngs]
    head = struct.pack("<HHH", 0, 1, len(sizes))
    offset = len(head) + 16 * len(sizes)
    entries, blobs = b"", b""
    for s in sizes:
        data = pngs[s]
        dim = 0 if s >= 256 else s  # 0 means 256 in the ICO format
        entries += struct.pack("<BBBBHHII", dim, dim, 0, 0, 1, 32, len(data), offset)
        blobs += data
        offset += len(data)
    return head + entries + blobs


def icns_bytes(pngs: dict[int, bytes]) -> bytes:
    body = b""
    for size, kind in ICNS_TYPES.items():
        if size in pngs:
            body += kind + struct.pack(">I", 8 + len(pngs[size])) + pngs[size]
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def main() -> int:
    pngs = render_pngs(HERE / "switchyard.svg", HERE)
    (HERE / "switchyard.ico").write_bytes(ico_bytes(pngs))
    (HERE / "switchyard.icns").write_bytes(icns_bytes(pngs))
    print(f"wrote {len(pngs)} PNGs, switchyard.ico and switchyard.icns under {HERE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
