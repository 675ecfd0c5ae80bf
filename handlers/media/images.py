"""Image inputs, shared by every route that takes them: URL rules, decoding, fetching, type by
signature, completeness and size limits, each refusal in the wording the decision routes document.

Nothing decodes pixels before every check passed: types and dimensions are read from the file
headers, so a huge or broken image is refused before any decoder sees it. `field` names the image
in messages (`images[0]`, `input[1].content[2]`, `messages.0.content.1`).

Chat completions and responses also take `http`/`https` URLs: the image is fetched with a timeout
and a size cap, following redirects only to other `http`/`https` URLs, and only from public
addresses unless the server runs with --allow-private-urls.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import socket
import string
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urljoin, urlsplit

from starlette.concurrency import run_in_threadpool

from swama.handlers.http.errors import ApiError

MiB = 1024 * 1024
MAX_IMAGES = 4
MAX_IMAGE_BYTES = 4 * MiB
MAX_TOTAL_BYTES = 8 * MiB
MAX_PIXELS = 16_000_000
MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp")
ALLOWED = "image/png, image/jpeg, or image/webp"
FETCH_TIMEOUT_SECONDS = 10.0  # for the whole fetch, redirects included
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_REDIRECTS = 3
# Characters a URL may carry unescaped; anything else (spaces, non-ASCII, quotes...) is refused.
_URL_CHARS = frozenset(string.ascii_letters + string.digits + "-._~:/?#[]@!$&'()*+,;=%")
_MEDIA_SUBTYPE_CHARS = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~")


@dataclass(frozen=True)
class Image:
    field: str
    media_type: str
    data: bytes
    width: int
    height: int
    detail: str | None = None


class ImageError(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(400, message, code="invalid_image")


@dataclass(frozen=True)
class ImageRef:
    """An image part as a request names it, not yet loaded."""

    field: str
    url: str
    detail: str | None = None


def valid_image_url(url: str) -> bool:
    """`data:image/<subtype>;base64,<payload>`, or http(s) with a host, no userinfo and a port in 1-65535."""
    if url.lower().startswith("data:"):
        return _valid_data_url(url)
    return _valid_http_url(url)


def _valid_data_url(url: str) -> bool:
    header, comma, payload = url.partition(",")
    if not comma:
        return False
    pieces = header.split(";")
    if len(pieces) != 2 or pieces[1].lower() != "base64":
        return False
    media = pieces[0]
    if not media.lower().startswith("data:image/") or media.count("/") != 1:
        return False
    subtype = media.split("/", 1)[1]
    if not subtype or not set(subtype) <= _MEDIA_SUBTYPE_CHARS:
        return False
    try:
        return bool(base64.b64decode(payload, validate=True))
    except (binascii.Error, ValueError):
        return False


def _valid_http_url(url: str) -> bool:
    if not url or not set(url) <= _URL_CHARS:
        return False
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a bad port or bracketed host
        return False
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return False
    if parts.username is not None or parts.password is not None:
        return False
    return _explicit_port_ok(parts) and (port is None or 1 <= port <= 65535)


def _explicit_port_ok(parts: SplitResult) -> bool:
    """A colon after the host must be followed by a decimal port (urlsplit accepts `host:`)."""
    host_port = parts.netloc.rpartition("@")[2]
    if host_port.startswith("["):
        rest = host_port.partition("]")[2]
    else:
        rest = host_port[host_port.find(":"):] if ":" in host_port else ""
    if not rest:
        return True
    digits = rest[1:]
    return rest[0] == ":" and digits.isascii() and digits.isdigit() and 1 <= int(digits) <= 65535




def sniff(data: bytes) -> str | None:
    """The media type the bytes are, by their signature."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def decode_data_url(url: str, field: str, *, remote_allowed: bool = False) -> tuple[str, bytes]:
    """The declared media type and the bytes of a `data:image/<type>;base64,...` URL."""
    if not url[:5].lower() == "data:":
        if url[:7].lower() == "http://" or url[:8].lower() == "https://":
            if not remote_allowed:
                raise ImageError(f"{field} must be a base64 data URL; remote URLs are not accepted.")
        raise ImageError(f"{field} must be a base64 data URL.")
    header, comma, payload = url[5:].partition(",")
    pieces = header.split(";")
    if not comma or len(pieces) != 2 or pieces[1].strip().lower() != "base64":
        raise ImageError(f"{field} must be a base64 data URL.")
    media_type = pieces[0].strip().lower()
    if media_type not in MEDIA_TYPES:
        raise ImageError(f"{field} data URL must be {ALLOWED}.")
    return media_type, decode_base64(payload, field)


def decode_base64(payload: str, field: str) -> bytes:
    # A decoded image is at most 4 MiB, so a longer payload is refused before it is decoded.
    if len(payload) > (MAX_IMAGE_BYTES // 3 + 2) * 4 + 64:
        raise ImageError(f"{field} is larger than 4 MiB.")
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{field} is not valid base64.") from None


def _png(data: bytes) -> tuple[int, int] | None:
    """Dimensions of a complete PNG (every chunk fits, IEND reached), else None; (0, 0) when IHDR is
    not the first chunk and the only one. Decoders read the first IHDR: a second one could claim other
    dimensions than those decoded."""
    pos, size = 8, None
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        end = pos + 12 + length
        if end > len(data):
            return None
        if (kind == b"IHDR") != (pos == 8) or kind == b"IHDR" and length < 8:
            return 0, 0  # complete, perhaps, but not a PNG any decoder reads as it claims
        if kind == b"IHDR":
            size = struct.unpack(">II", data[pos + 8:pos + 16])
        if kind == b"IEND":
            return size
        pos = end
    return None


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg(data: bytes) -> tuple[int, int] | None:
    """Dimensions of a complete JPEG, walked segment by segment to its EOI (so the EOI of an EXIF
    thumbnail inside a segment does not count), else None."""
    pos, size = 2, None
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0xD9:
            return size
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2:pos + 4])
        if length < 2 or pos + 2 + length > len(data):
            return None
        if marker in _SOF and length >= 7:
            height, width = struct.unpack(">HH", data[pos + 5:pos + 9])
            size = (width, height)
        pos += 2 + length
        if marker == 0xDA:  # entropy-coded data follows the scan header: find the next marker
            while pos + 1 < len(data) and not (data[pos] == 0xFF and data[pos + 1] not in (0x00, *range(0xD0, 0xD8))):
                pos += 1
    if pos + 2 <= len(data) and data[pos:pos + 2] == b"\xff\xd9":
        return size
    return None


def _webp(data: bytes) -> tuple[int, int] | None:
    """Dimensions of a complete WebP (its RIFF size fits), else None."""
    (riff_size,) = struct.unpack("<I", data[4:8])
    if riff_size + 8 > len(data) or len(data) < 30:
        return None
    chunk = data[12:16]
    if chunk == b"VP8X":
        width = 1 + int.from_bytes(data[24:27], "little")
        height = 1 + int.from_bytes(data[27:30], "little")
        return width, height
    if chunk == b"VP8L" and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return None


_DIMENSIONS = {"image/png": _png, "image/jpeg": _jpeg, "image/webp": _webp}


def check_image(data: bytes, field: str, declared: str | None = None, detail: str | None = None) -> Image:
    """Judge one image's bytes: a supported type (matching the declared one), complete, within the
    size and pixel limits."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"{field} is larger than 4 MiB.")
    actual = sniff(data)
    if actual is None:
        raise ImageError(f"{field} must be PNG, JPEG, or WebP data.")
    if declared is not None and declared != actual:
        raise ImageError(f"{field} is declared {declared} but contains {actual}.")
    size = _DIMENSIONS[actual](data)
    if size is None:
        raise ImageError(f"{field} is truncated or incomplete.")
    width, height = size
    if width <= 0 or height <= 0:
        raise ImageError(f"{field} is not a decodable image.")
    if width * height > MAX_PIXELS:
        raise ImageError(f"{field} is larger than 16 megapixels.")
    if _decoder_size(data) != size:  # the decoder's own header read: the size it would decode
        raise ImageError(f"{field} is not a decodable image: its headers disagree on its size.")
    return Image(field, actual, data, width, height, detail)


def _decoder_size(data: bytes) -> tuple[int, int] | None:
    """The dimensions Pillow reads from the headers (no pixels decoded), None when it cannot."""
    import io

    from PIL import Image as PILImage

    try:
        with PILImage.open(io.BytesIO(data)) as opened:
            return opened.size
    except Exception:  # Pillow raises many types for bad data
        return None


def check_images(images: Sequence[Image]) -> None:
    """Limits over all the images of one request."""
    if len(images) > MAX_IMAGES:
        raise ImageError(f"A request accepts at most {MAX_IMAGES} images.")
    if sum(len(image.data) for image in images) > MAX_TOTAL_BYTES:
        raise ImageError("images exceed 8 MiB in total.")


def open_image(image: Image):  # -> PIL.Image.Image
    """Decode a checked image's pixels (for a vision processor)."""
    import io

    from PIL import Image as PILImage

    # Pillow's own bomb guard as a second line (it refuses past twice the limit; check_image already
    # refused past the limit by the same header read).
    PILImage.MAX_IMAGE_PIXELS = MAX_PIXELS
    try:
        opened = PILImage.open(io.BytesIO(image.data))
        if opened.size != (image.width, image.height):
            raise ValueError("the decoder reads another size than was checked")
        opened.load()
    except Exception:  # Pillow raises many types for bad data
        raise ImageError(f"{image.field} is not a decodable image.") from None
    return opened


async def fetch_image(url: str, field: str, *, private_allowed: bool = False,
                      timeout: float = FETCH_TIMEOUT_SECONDS, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """The body of an `http`/`https` image URL: at most `max_bytes`, within `timeout` seconds in all,
    following at most MAX_REDIRECTS redirects and only to `http`/`https` URLs. Each host is resolved
    here and must have only public addresses (unless `private_allowed`: --allow-private-urls); the
    connection goes to the address that was checked, so a name cannot be rebound in between. Every
    failure to fetch reads the same, so the answers cannot map a network (a port closed, filtered or
    serving a 404 look alike)."""
    import httpx

    unreachable = ImageError(f"{field} could not be fetched.")
    try:
        async with asyncio.timeout(timeout), \
                httpx.AsyncClient(follow_redirects=False, timeout=timeout, trust_env=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                parts = urlsplit(url)
                address = await _checked_address(parts, field, private_allowed)
                if address is None:
                    raise unreachable
                host = f"[{address}]" if ":" in address else address
                direct = parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")).geturl()
                extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
                async with client.stream("GET", direct, headers={"host": parts.netloc.rsplit("@", 1)[-1]},
                                         extensions=extensions) as response:
                    if response.is_redirect:
                        target = urljoin(url, response.headers.get("location", ""))
                        if not _valid_http_url(target):
                            raise ImageError(f"{field} redirects to a URL that is not http or https.")
                        url = target
                        continue
                    if response.status_code != 200:
                        raise unreachable
                    declared = response.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > max_bytes:
                        raise ImageError(f"{field} is larger than 4 MiB.")
                    body = bytearray()
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > max_bytes:
                            raise ImageError(f"{field} is larger than 4 MiB.")
                    return bytes(body)
    except (TimeoutError, httpx.HTTPError):
        raise unreachable from None
    raise ImageError(f"{field} redirects more than {MAX_REDIRECTS} times.")


async def _checked_address(parts: SplitResult, field: str, private_allowed: bool) -> str | None:
    """The address to connect to for a URL's host: each address the name resolves to must be public
    (ImageError naming the rule otherwise, unless `private_allowed`); None when it does not resolve."""
    host = parts.hostname or ""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, parts.port or DEFAULT_PORTS[parts.scheme],
                                                             type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    addresses = [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]
    if not addresses:
        return None
    if not private_allowed and not all(a.is_global for a in addresses):
        raise ImageError(f"{field} points at a private, loopback or link-local address, which this server does "
                         "not fetch from (--allow-private-urls allows it).")
    return str(addresses[0])


async def load_images(refs: Sequence[ImageRef], *, remote_allowed: bool, private_allowed: bool = False) -> list[Image]:
    """Every image of a request, decoded (or fetched) and checked, then the request-wide limits; the
    checks walk the files' bytes, so they run in Starlette's bounded thread pool, off the event loop."""
    if len(refs) > MAX_IMAGES:
        raise ImageError(f"A request accepts at most {MAX_IMAGES} images.")
    images = []
    for ref in refs:
        if remote_allowed and ref.url[:5].lower() != "data:":
            if not _valid_http_url(ref.url):
                raise ImageError("Invalid image URL")
            data = await fetch_image(ref.url, ref.field, private_allowed=private_allowed)
            images.append(await run_in_threadpool(check_image, data, ref.field, None, ref.detail))
        else:
            images.append(await run_in_threadpool(load_data_image, ref, remote_allowed=remote_allowed))
    check_images(images)
    return images


def load_data_image(ref: ImageRef, *, remote_allowed: bool = False) -> Image:
    declared, data = decode_data_url(ref.url, ref.field, remote_allowed=remote_allowed)
    return check_image(data, ref.field, declared, ref.detail)


async def load_data_images(refs: Sequence[ImageRef]) -> list[Image]:
    """The images of a decision request: base64 data URLs only, checked off the event loop."""
    return await load_images(refs, remote_allowed=False)


def all_low_detail(images: Sequence[Image]) -> bool:
    """`detail: "low"` on every image (and at least one image): decisions then resize to 512 px."""
    return bool(images) and all(image.detail == "low" for image in images)


def data_url(image: Image) -> str:
    return f"data:{image.media_type};base64,{base64.b64encode(image.data).decode('ascii')}"


async def open_images(images: Sequence[Image]) -> list[Any]:
    """The images' pixels, decoded in Starlette's bounded thread pool, off the event loop."""
    if not images:
        return []
    return await run_in_threadpool(lambda: [open_image(image) for image in images])
