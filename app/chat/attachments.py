"""Images attached to chat messages: the bounds they are kept within and how they become request parts.

Decoding and scaling pixels needs an imaging library, and only the desktop (Qt) has one, so the caller
passes an `ImageCodec` (app/ui/chat_images.py is Qt's); everything else here is plain bytes. An image is
scaled down to `MAX_SIDE` pixels on its longest side and re-encoded before it is stored, so a photo from a
phone costs a few hundred KiB in chat.db, not megabytes.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Protocol

from app.core.errors import ImageTooLargeError, InvalidImageError

MIB = 1 << 20
MAX_SIDE = 1536  # pixels on the longest side of a stored image
MAX_INPUT_BYTES = 40 * MIB  # a file larger than this is refused before it is decoded
MAX_STORED_BYTES = 4 * MIB  # one image after downscaling
MAX_DB_IMAGE_BYTES = 512 * MIB  # every image in chat.db together
MAX_IMAGES_PER_MESSAGE = 8


@dataclass(frozen=True)
class Picture:
    """An image ready to store: encoded bytes of a type every engine takes, and its size in pixels."""

    mime: str
    data: bytes
    width: int
    height: int

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


@dataclass(frozen=True)
class Attachment:
    """A stored image's record (its bytes are read apart: `ChatStore.image`)."""

    id: int
    message: int
    mime: str
    width: int
    height: int
    size: int


class ImageCodec(Protocol):
    def fit(self, data: bytes, *, max_side: int) -> Picture:
        """`data` decoded, scaled down to `max_side` on its longest side when larger, and encoded as png
        (with transparency) or jpeg; ValueError with a reason when it is not an image it can read."""
        ...


def prepare(data: bytes, *, codec: ImageCodec, name: str = "the image") -> Picture:
    """A picture within the bounds, or InvalidImageError / ImageTooLargeError saying what to do."""
    if not data:
        raise InvalidImageError(f"{name} is empty; attach the file again", param="image")
    if len(data) > MAX_INPUT_BYTES:
        raise ImageTooLargeError(
            f"{name} is {len(data) / MIB:.1f} MiB; attach an image of at most {MAX_INPUT_BYTES // MIB} MiB",
            param="image",
        )
    try:
        pic = codec.fit(data, max_side=MAX_SIDE)
    except ValueError as exc:
        raise InvalidImageError(
            f"{name} could not be read as an image ({exc}); attach a png, jpeg, gif, webp or bmp file",
            param="image",
        ) from None
    if len(pic.data) > MAX_STORED_BYTES:
        raise ImageTooLargeError(
            f"{name} is still {len(pic.data) / MIB:.1f} MiB after scaling to {MAX_SIDE} px; attach a "
            f"simpler image (at most {MAX_STORED_BYTES // MIB} MiB stored)",
            param="image",
        )
    return pic
