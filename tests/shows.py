# Objects that show themselves, for the rich-results tests (jail/src/
# display.py): put before a test's own code (tests/tests/results.rs,
# tests/fronts/tests/front_doors.rs, python/tests/test_results.py).
import struct, zlib


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


# A real PNG of 3 x 2 red pixels.
PNG = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 3, 2, 8, 2, 0, 0, 0))
       + chunk(b"IDAT", zlib.compress((b"\x00" + b"\xff\x00\x00" * 3) * 2)) + chunk(b"IEND", b""))


class Picture:
    """Shows as a PNG, nothing else."""
    def _repr_png_(self):
        return PNG
    def __repr__(self):
        return "Picture()"


class Chart:
    """Shows as HTML with a script in it, and as a PNG."""
    def _repr_html_(self):
        return "<b>chart</b><script>alert(1)</script>"
    def _repr_png_(self):
        return PNG
    def __repr__(self):
        return "Chart()"


class Liar:
    """Says its PNG is one; it is an SVG."""
    def _repr_png_(self):
        return b"<svg onload='x'/>"
    def __repr__(self):
        return "Liar()"
