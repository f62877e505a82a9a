"""Qt's side of chat images: decoding, scaling and encoding for the store (an `ImageCodec`), thumbnails, and
reading images out of the clipboard or a drop (QMimeData: image data, or image file URLs)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMimeData, Qt
from PySide6.QtGui import QImage, QPixmap

from app.chat.attachments import Picture

THUMB_SIDE = 96
JPEG_QUALITY = 88
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp")


def _sniffed(data: bytes) -> str | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    return None


def _encode(image: QImage, fmt: str, quality: int = -1) -> bytes:
    buf = QByteArray()
    dev = QBuffer(buf)
    dev.open(QIODevice.OpenModeFlag.WriteOnly)
    # PySide6 takes the format as str here (its stubs say bytes, which it refuses at run time)
    if not image.save(dev, fmt, quality):  # type: ignore[call-overload]
        raise ValueError(f"Qt could not encode it as {fmt}")
    dev.close()
    return bytes(buf.data())


class QtImageCodec:
    """Decodes with Qt's image plugins and always re-encodes, so what is stored is an image the engine can
    read even when the file was cut short (Qt shows what it could decode of it)."""

    def fit(self, data: bytes, *, max_side: int) -> Picture:
        image = QImage.fromData(data)
        if image.isNull():
            raise ValueError("Qt cannot decode it")
        if max(image.width(), image.height()) > max_side:
            image = image.scaled(
                max_side,
                max_side,
                Qt.AspectRatioMode.KeepAspectRatio,
                Qt.TransformationMode.SmoothTransformation,
            )
        # screenshots and transparency stay png (sharp text); photos are far smaller as jpeg
        if image.hasAlphaChannel() or _sniffed(data) == "image/png":
            return Picture("image/png", _encode(image, "PNG"), image.width(), image.height())
        rgb = image.convertToFormat(QImage.Format.Format_RGB888)
        return Picture("image/jpeg", _encode(rgb, "JPEG", JPEG_QUALITY), rgb.width(), rgb.height())


def thumbnail(data: bytes, side: int = THUMB_SIDE) -> QImage:
    """A small copy for the composer and the history; a null image if `data` cannot be decoded."""
    image = QImage.fromData(data)
    if image.isNull():
        return image
    return image.scaled(
        side, side, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation
    )


def thumbnail_pixmap(data: bytes, side: int = THUMB_SIDE) -> QPixmap:
    return QPixmap.fromImage(thumbnail(data, side))


def images_in(mime: QMimeData) -> list[tuple[str, bytes]]:
    """(name, bytes) of each image a paste or drop carries: local image files first, else the image itself
    (a screenshot copied to the clipboard has no file), encoded as png."""
    out: list[tuple[str, bytes]] = []
    for url in mime.urls() if mime.hasUrls() else ():
        path = Path(url.toLocalFile()) if url.isLocalFile() else None
        if path is not None and path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
            out.append((path.name, path.read_bytes()))
    if not out and mime.hasImage():
        image = QImage(mime.imageData())
        if not image.isNull():
            out.append(("pasted image", _encode(image, "PNG")))
    return out


def carries_images(mime: QMimeData) -> bool:
    if mime.hasImage():
        return True
    return any(
        u.isLocalFile() and Path(u.toLocalFile()).suffix.lower() in IMAGE_SUFFIXES
        for u in (mime.urls() if mime.hasUrls() else ())
    )
