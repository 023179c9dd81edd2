"""Reading the pixels of the PNGs Chromium writes, to tell whether an emoji was drawn in colour.

A missing glyph is drawn as a box in the text's own (grey) colour, and antialiased black text is grey too;
a colour emoji font draws saturated pixels. So "some pixels are far from grey" tells the two apart.
"""

from __future__ import annotations

import struct
import zlib

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {2: 3, 6: 4}  # colour type -> samples per pixel (RGB, RGBA); Chromium writes one of these


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk."""
    if not data.startswith(_SIGNATURE):
        raise ValueError("not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def rgb_pixels(data: bytes) -> list[tuple[int, int, int]]:
    """Every pixel's (r, g, b) of an 8-bit, non-interlaced RGB or RGBA PNG."""
    width, height = png_size(data)
    bit_depth, colour_type, interlace = data[24], data[25], data[28]
    if bit_depth != 8 or colour_type not in _CHANNELS or interlace != 0:
        raise ValueError(f"unsupported PNG: depth {bit_depth}, colour type {colour_type}, interlace {interlace}")
    channels = _CHANNELS[colour_type]
    idat = bytearray()
    offset = 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        tag = data[offset + 4 : offset + 8]
        if tag == b"IDAT":
            idat += data[offset + 8 : offset + 8 + length]
        offset += 12 + length
    raw = zlib.decompress(bytes(idat))
    stride = width * channels
    previous = bytearray(stride)
    pixels: list[tuple[int, int, int]] = []
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            upper_left = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                line[i] = (line[i] + _paeth(left, up, upper_left)) & 0xFF
        pixels += [(line[x], line[x + 1], line[x + 2]) for x in range(0, stride, channels)]
        previous = line
    return pixels


def colourful_pixels(data: bytes, spread: int = 80) -> int:
    """How many pixels have channels at least ``spread`` apart (clearly not grey)."""
    return sum(1 for r, g, b in rgb_pixels(data) if max(r, g, b) - min(r, g, b) >= spread)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c
