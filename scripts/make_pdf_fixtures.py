#!/usr/bin/env python3
"""Write the PDF test fixtures under ``tests/fixtures/pdf/`` (deterministic, < 100 KB).

Run from the repository root with Pillow and pypdf (RC4 needs no extra package):

    python3 -m venv /tmp/fixvenv && /tmp/fixvenv/bin/pip install pillow==13.0.0 pypdf==7.1.0
    /tmp/fixvenv/bin/python scripts/make_pdf_fixtures.py

What it writes:

``two_pages.pdf``  written by hand (below), two pages, each one lossless (FlateDecode) RGB
                   image filling the page, placed at 200 DPI so that a 200-DPI render gives
                   back the image's own pixel size:
                   page 1: ``tiny-lightonocr/images/aligned.png`` (224x56 px = 80.64x20.16 pt),
                   with a /Square annotation (blue appearance stream) on the 8x8 px square in
                   the top-left corner, which only renders when annotations are drawn;
                   page 2: ``tiny-lightonocr/images/wide_downscale.png`` (1800x96 px =
                   648x34.56 pt), which ocrctl renders capped at 1540 px wide (1540x82).
``encrypted.pdf``  ``two_pages.pdf`` encrypted by pypdf with the user password ``secret``
                   (RC4-128), so it cannot be opened without the password.
``truncated.pdf``  the first 60 bytes of ``two_pages.pdf``: a header and a cut first object.
"""

import io
import random
import secrets
import zlib
from pathlib import Path

from PIL import Image
from pypdf import PdfReader, PdfWriter

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "tests/fixtures/tiny-lightonocr/images"
OUT = ROOT / "tests/fixtures/pdf"
DPI = 200.0
# The annotation's square, in image pixels from the top-left corner.
ANNOT_PX = 8


def pt(px: int) -> float:
    """Pixels at DPI to PDF points (1/72 inch)."""
    return px * 72.0 / DPI


def num(x: float) -> bytes:
    return (f"{x:.4f}".rstrip("0").rstrip(".")).encode()


def stream(dict_body: bytes, data: bytes) -> bytes:
    return b"<< " + dict_body + b" /Length " + str(len(data)).encode() + b" >>\nstream\n" + data + b"\nendstream"


def write_pdf(pages: list[tuple[Image.Image, bool]]) -> bytes:
    """A minimal PDF: one image per page, optionally with the corner annotation."""
    objects: list[bytes] = []  # object i + 1

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    catalog = add(b"")  # filled in at the end
    pages_obj = add(b"")
    kids = []
    for img, annotate in pages:
        w_px, h_px = img.size
        w, h = pt(w_px), pt(h_px)
        pixels = zlib.compress(img.convert("RGB").tobytes(), 9)
        image = add(stream(
            b"/Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceRGB "
            b"/BitsPerComponent 8 /Filter /FlateDecode" % (w_px, h_px),
            pixels,
        ))
        content = add(stream(b"", b"q " + num(w) + b" 0 0 " + num(h) + b" 0 0 cm /Im0 Do Q"))
        annots = b""
        if annotate:
            s = pt(ANNOT_PX)
            ap = add(stream(
                b"/Type /XObject /Subtype /Form /BBox [0 0 " + num(s) + b" " + num(s) + b"]",
                b"0 0 1 rg 0 0 " + num(s) + b" " + num(s) + b" re f",
            ))
            rect = b"[0 " + num(h - s) + b" " + num(s) + b" " + num(h) + b"]"
            annot = add(
                b"<< /Type /Annot /Subtype /Square /Rect " + rect
                + b" /F 4 /C [0 0 1] /IC [0 0 1] /AP << /N %d 0 R >> >>" % ap
            )
            annots = b" /Annots [%d 0 R]" % annot
        page = add(
            b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 " % pages_obj + num(w) + b" " + num(h)
            + b"] /Resources << /XObject << /Im0 %d 0 R >> >> /Contents %d 0 R" % (image, content)
            + annots + b" >>"
        )
        kids.append(page)
    objects[catalog - 1] = b"<< /Type /Catalog /Pages %d 0 R >>" % pages_obj
    objects[pages_obj - 1] = (
        b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % k for k in kids)
        + b"] /Count %d >>" % len(kids)
    )
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % i + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for off in offsets:
        out.write(b"%010d 00000 n \n" % off)
    out.write(b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n"
              % (len(objects) + 1, catalog, xref))
    return out.getvalue()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    good = write_pdf([
        (Image.open(IMAGES / "aligned.png"), True),
        (Image.open(IMAGES / "wide_downscale.png"), False),
    ])
    (OUT / "two_pages.pdf").write_bytes(good)
    assert len(PdfReader(io.BytesIO(good)).pages) == 2

    # pypdf draws the file ID (and so the RC4 key) from `secrets`: seed it for reproducibility.
    rng = random.Random(1234)
    secrets.token_bytes = lambda n=32: rng.randbytes(n)
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(good)))
    writer.encrypt(user_password="secret", owner_password="owner", algorithm="RC4-128")
    enc = io.BytesIO()
    writer.write(enc)
    data = enc.getvalue()
    (OUT / "encrypted.pdf").write_bytes(data)
    assert PdfReader(io.BytesIO(data)).is_encrypted

    (OUT / "truncated.pdf").write_bytes(good[:60])
    for f in sorted(OUT.iterdir()):
        print(f"{f.relative_to(ROOT)}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
