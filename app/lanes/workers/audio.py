"""Audio in for the whisper.cpp lane: any WAV (PCM 8/16/24/32-bit or float, any rate, any channels)
read with the standard library and numpy, resampled to whisper's 16 kHz mono; other containers through
ffmpeg when it is on PATH. Pure functions: the worker calls them off its event loop."""

from __future__ import annotations

import shutil
import struct
import subprocess

import numpy as np

RATE = 16000
_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE


class AudioError(ValueError):
    """The upload cannot be read; the message says what to send instead."""


def _chunks(data: bytes) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    pos = 12
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        out.setdefault(cid, data[pos + 8 : pos + 8 + size])
        pos += 8 + size + (size & 1)
    return out


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """(float32 samples in [-1, 1], mono, and the file's rate)."""
    chunks = _chunks(data)
    fmt, pcm = chunks.get(b"fmt "), chunks.get(b"data")
    if fmt is None or pcm is None or len(fmt) < 16:
        raise AudioError("the WAV file has no fmt or data chunk; send a complete WAV file")
    tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", fmt)
    if tag == _EXTENSIBLE and len(fmt) >= 26:
        tag = struct.unpack_from("<H", fmt, 24)[0]  # the sub-format GUID starts with the plain tag
    if channels < 1 or rate < 1000:
        raise AudioError(f"the WAV header says {channels} channel(s) at {rate} Hz; that is not audio")
    width = bits // 8
    usable = len(pcm) - len(pcm) % (width * channels) if width else 0
    raw = pcm[:usable]
    if tag == _FLOAT and bits in (32, 64):
        samples = np.frombuffer(raw, dtype="<f4" if bits == 32 else "<f8").astype(np.float32)
    elif tag == _PCM and bits == 8:
        samples = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif tag == _PCM and bits in (16, 32):
        dtype = "<i2" if bits == 16 else "<i4"
        samples = np.frombuffer(raw, dtype=dtype).astype(np.float32) / float(1 << (bits - 1))
    elif tag == _PCM and bits == 24:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        ints = (b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8 >> 8  # sign-extend 24 bits
        samples = ints.astype(np.float32) / float(1 << 23)
    else:
        raise AudioError(
            f"WAV encoding {tag} with {bits}-bit samples is not supported; "
            "send PCM (8/16/24/32-bit) or float WAV"
        )
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1)
    return samples, int(rate)


def resample(samples: np.ndarray, rate: int, *, to: int = RATE) -> np.ndarray:
    """Linear interpolation: plenty for speech recognition, which looks at an 8 kHz band at most."""
    if rate == to or samples.size == 0:
        return samples.astype(np.float32)
    n = round(samples.size * to / rate)
    t = np.arange(n, dtype=np.float64) * (rate / to)
    return np.interp(t, np.arange(samples.size), samples).astype(np.float32)


def ffmpeg_path() -> str | None:
    return shutil.which("ffmpeg")


def decode(data: bytes, *, filename: str = "") -> np.ndarray:
    """16 kHz mono float32 samples from an uploaded file."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        samples, rate = read_wav(data)
        return resample(samples, rate)
    ffmpeg = ffmpeg_path()
    if ffmpeg is None:
        what = f" ({filename})" if filename else ""
        raise AudioError(
            f"the file{what} is not a WAV file, and other formats need ffmpeg, which is not installed here; "
            "send WAV, or install ffmpeg on the server"
        )
    proc = subprocess.run(
        [
            ffmpeg,
            "-nostdin",
            "-loglevel",
            "error",
            "-i",
            "pipe:0",
            "-f",
            "s16le",
            "-ac",
            "1",
            "-ar",
            str(RATE),
            "pipe:1",
        ],
        input=data,
        capture_output=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["unknown error"]
        raise AudioError(f"ffmpeg could not decode the file: {why[0]}")
    return np.frombuffer(proc.stdout, dtype="<i2").astype(np.float32) / 32768.0
