"""The shared image-input rules, on real files made with Pillow and on crafted broken ones."""

from __future__ import annotations

import base64
import io
import os
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image as PILImage

from swama.handlers.media.images import (
    Image,
    ImageError,
    check_image,
    check_images,
    decode_data_url,
    open_image,
    sniff,
)


def encoded(kind: str, size: tuple[int, int] = (8, 6), noise: bool = False, **save: object) -> bytes:
    if noise:
        picture = PILImage.frombytes("RGB", size, os.urandom(size[0] * size[1] * 3))
    else:
        picture = PILImage.new("RGB", size, (200, 30, 30))
    out = io.BytesIO()
    picture.save(out, format=kind, **save)
    return out.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def png_header_only(width: int, height: int) -> bytes:
    """A structurally complete PNG whose header claims width x height over a tiny body."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")


@pytest.mark.parametrize(("kind", "media_type", "options"), [
    ("PNG", "image/png", {}), ("JPEG", "image/jpeg", {}), ("WEBP", "image/webp", {"lossless": True}),
    ("WEBP", "image/webp", {"quality": 80}),
])
def test_real_files_pass_with_their_dimensions(kind: str, media_type: str, options: dict) -> None:
    data = encoded(kind, (37, 21), **options)
    assert sniff(data) == media_type
    declared, raw = decode_data_url(data_url(data, media_type), "images[0]")
    image = check_image(raw, "images[0]", declared)
    assert (image.media_type, image.width, image.height) == (media_type, 37, 21)
    assert open_image(image).size == (37, 21)


def test_jpeg_with_an_exif_thumbnail_is_walked_to_its_own_end() -> None:
    thumb = encoded("JPEG", (4, 4))
    exif = b"Exif\0\0" + thumb  # a thumbnail's EOI inside an APP1 segment does not end the file
    body = encoded("JPEG", (16, 16))
    data = body[:2] + b"\xff\xe1" + struct.pack(">H", len(exif) + 2) + exif + body[2:]
    assert check_image(data, "f").width == 16
    with pytest.raises(ImageError, match="truncated or incomplete"):
        check_image(data[: len(data) - 40], "f")


def test_trailing_bytes_after_a_complete_file_are_allowed() -> None:
    assert check_image(encoded("PNG") + b"trailer", "f").width == 8


@pytest.mark.parametrize(("data", "declared", "message"), [
    (encoded("PNG")[:-20], None, "images[0] is truncated or incomplete."),
    (encoded("PNG")[:40], None, "images[0] is truncated or incomplete."),
    (encoded("WEBP", lossless=True)[:-10], None, "images[0] is truncated or incomplete."),
    (encoded("JPEG")[:-2], None, "images[0] is truncated or incomplete."),
    (encoded("JPEG"), "image/png", "images[0] is declared image/png but contains image/jpeg."),
    (b"GIF89a" + b"\0" * 20, None, "images[0] must be PNG, JPEG, or WebP data."),
    (png_header_only(5000, 4000), None, "images[0] is larger than 16 megapixels."),
    (png_header_only(0, 10), None, "images[0] is not a decodable image."),
    (b"\x89PNG\r\n\x1a\n" + b"\0" * (4 * 1024 * 1024), None, "images[0] is larger than 4 MiB."),
])
def test_broken_and_oversized_files_are_refused(data: bytes, declared: str | None, message: str) -> None:
    with pytest.raises(ImageError) as refused:
        check_image(data, "images[0]", declared)
    assert (refused.value.status, refused.value.message) == (400, message)


def test_a_huge_header_is_refused_before_any_decoding() -> None:
    image = check_image(png_header_only(4000, 4000), "f")  # 16 MP exactly: allowed by the header
    assert (image.width, image.height) == (4000, 4000)
    with pytest.raises(ImageError, match="not a decodable image"):
        open_image(image)  # its body holds no such picture


def test_a_png_is_sized_by_its_first_header_as_decoders_read_it() -> None:
    """A second IHDR claiming 1x1 after a first claiming 6000x6000 (what a decoder reads) passed the
    size check before, which read the last one; now a PNG whose IHDR is not its first and only chunk
    of that kind is refused, and any file whose headers the decoder reads otherwise than the check."""
    big = png_header_only(6000, 6000)
    second = png_header_only(1, 1)[8:33]  # the small file's IHDR chunk
    forged = big[:33] + second + big[33:]
    with pytest.raises(ImageError, match=r"^f is not a decodable image\.$"):
        check_image(forged, "f")
    with pytest.raises(ImageError, match=r"^f is larger than 16 megapixels\.$"):
        check_image(big, "f")
    late = b"\x89PNG\r\n\x1a\n" + big[33:-12] + big[8:33] + big[-12:]  # IHDR after the data
    with pytest.raises(ImageError, match=r"^f is not a decodable image\.$"):
        check_image(late, "f")


@pytest.mark.parametrize(("url", "message"), [
    ("https://example.com/cat.png", "f must be a base64 data URL; remote URLs are not accepted."),
    ("HTTP://example.com/cat.png", "f must be a base64 data URL; remote URLs are not accepted."),
    ("file:///etc/passwd", "f must be a base64 data URL."),
    ("ftp://example.com/cat.png", "f must be a base64 data URL."),
    ("data:image/png,AAAA", "f must be a base64 data URL."),
    ("data:image/gif;base64,R0lGODlh", "f data URL must be image/png, image/jpeg, or image/webp."),
    ("data:image/png;base64,***", "f is not valid base64."),
    ("data:image/png;base64," + "A" * (6 * 1024 * 1024), "f is larger than 4 MiB."),
])
def test_data_url_rules(url: str, message: str) -> None:
    with pytest.raises(ImageError) as refused:
        decode_data_url(url, "f")
    assert refused.value.message == message


def test_the_data_prefix_is_case_insensitive_and_remote_may_be_allowed() -> None:
    declared, data = decode_data_url(data_url(encoded("PNG")).replace("data:", "DATA:"), "f")
    assert declared == "image/png" and check_image(data, "f").height == 6
    with pytest.raises(ImageError, match=r"^f must be a base64 data URL\.$"):
        decode_data_url("https://example.com/x.png", "f", remote_allowed=True)  # not a data URL either


def test_request_limits() -> None:
    one = check_image(encoded("PNG"), "images[0]")
    check_images([one] * 4)
    with pytest.raises(ImageError, match=r"^A request accepts at most 4 images\.$"):
        check_images([one] * 5)
    # Three noise images of about 3 MiB each: each allowed, 9 MiB together refused.
    big = [check_image(encoded("PNG", (1024, 1024), noise=True), f"images[{i}]") for i in range(3)]
    assert all(3 * 1024 * 1024 <= len(image.data) <= 4 * 1024 * 1024 for image in big)
    with pytest.raises(ImageError, match=r"^images exceed 8 MiB in total\.$"):
        check_images(big)
    assert isinstance(big[0], Image)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


_crafted_png = st.builds(
    lambda chunks: b"\x89PNG\r\n\x1a\n" + b"".join(chunks),
    st.lists(st.one_of(
        st.builds(lambda w, h, depth, color: _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color, 0, 0, 0)),
                  st.integers(0, 2 ** 32 - 1), st.integers(0, 2 ** 32 - 1), st.sampled_from([1, 8, 16, 3]),
                  st.sampled_from([0, 2, 3, 6, 7])),
        st.builds(lambda raw: _chunk(b"IDAT", zlib.compress(raw)), st.binary(max_size=256)),
        st.builds(lambda body: _chunk(b"PLTE", body), st.binary(max_size=48)),
        st.just(_chunk(b"IEND", b"")),
    ), max_size=6))


@given(data=st.one_of(st.binary(max_size=2048), _crafted_png))
@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_any_bytes_are_refused_as_an_image_error_or_decode_as_checked(data: bytes) -> None:
    """Whatever the bytes, the checks and the decoder either refuse them with an ImageError (a 400) or
    give pixels of the size that was checked, within the pixel limit."""
    try:
        image = check_image(data, "f")
        picture = open_image(image)
    except ImageError:
        return
    assert picture.size == (image.width, image.height) and image.width * image.height <= 16_000_000
