"""Parser bombs for the host-side artifact summarisers (issue 15), standard
library only. tests/tests/parser_bombs.rs runs `make(NAME)` inside the jail,
so each file is made by the script and judged by the supervisor.

Each bomb is cheap for the script to make and expensive for a naive reader
to summarise: a directory that claims millions of entries, a part that
inflates to gigabytes, a value tree that is thirty times its text.
"""
import os, struct, zipfile, zlib

MIB = 1 << 20


def _write_chunks(path, chunks):
    with open(path, "wb") as f:
        for c in chunks:
            f.write(c)


def zip64_decoy(path, entries=1_900_000):
    """A zip64 Office file whose real directory lists `entries` names, and,
    after its real end record, a decoy zip32 end record (one entry, a comment
    length past the end of the file). A reader that looks only at the last
    signature sees one entry; the zip crate skips the decoy and loads every
    name of the real directory."""
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 0, 0, 0, 0, 0, 0, 1, 0) + b"a"
    cd_offset = len(local)

    def names():
        fixed = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0)
        batch = []
        for i in range(entries):
            batch.append(fixed + b"%07d" % i)
            if len(batch) == 65536:
                yield b"".join(batch)
                batch = []
        yield b"".join(batch)

    cd_size = entries * (46 + 7)
    eocd64_offset = cd_offset + cd_size
    eocd64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, entries, entries, cd_size, cd_offset)
    locator = struct.pack("<IIQI", 0x07064B50, 0, eocd64_offset, 1)
    real = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    decoy = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, 53, cd_offset, 0xFFFF)
    _write_chunks(path, [local, *names(), eocd64, locator, real, decoy])


def _office(path, parts, method=zipfile.ZIP_DEFLATED):
    with zipfile.ZipFile(path, "w", method) as z:
        for name, data in parts:
            z.writestr(name, data)


SS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
TYPES = ('<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
         '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/></Types>')
WORKBOOK = (f'<?xml version="1.0"?><workbook xmlns="{SS}" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
            '<sheets><sheet name="S" sheetId="1" r:id="rId1"/></sheets></workbook>')
WBRELS = ('<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
          '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/>'
          '<Relationship Id="rId2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/sharedStrings" Target="sharedStrings.xml"/>'
          '</Relationships>')


def _xlsx(path, sheet, shared="<sst/>"):
    _office(path, [("[Content_Types].xml", TYPES), ("xl/workbook.xml", WORKBOOK),
                   ("xl/_rels/workbook.xml.rels", WBRELS), ("xl/sharedStrings.xml", shared),
                   ("xl/worksheets/sheet1.xml", sheet)])


def zip_inflate(path):
    """Every part of an XLSX inflates far past the per-part and per-file
    caps: 256 MiB of sheet XML and 64 MiB of shared strings, each written
    in pieces, and a stored entry whose header claims 4 GiB."""
    row = b'<row r="1"><c r="A1" t="s"><v>0</v></c></row>' * 20_000
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in [("[Content_Types].xml", TYPES), ("xl/workbook.xml", WORKBOOK), ("xl/_rels/workbook.xml.rels", WBRELS)]:
            z.writestr(name, data)
        for name, head, piece, tail, total in [
            ("xl/sharedStrings.xml", b"<sst>", b"<si><t>=1</t></si>" * 50_000, b"</sst>", 64 * MIB),
            ("xl/worksheets/sheet1.xml", f'<worksheet xmlns="{SS}"><sheetData>'.encode(), row, b"</sheetData></worksheet>", 256 * MIB),
        ]:
            with z.open(name, "w", force_zip64=True) as w:
                w.write(head)
                for _ in range(total // len(piece)):
                    w.write(piece)
                w.write(tail)
    # Claim 4 GiB uncompressed for the last entry in its central header.
    with open(path, "r+b") as f:
        data = f.read()
        at = data.rfind(b"PK\x01\x02")
        f.seek(at + 24)
        f.write(struct.pack("<I", 0xFFFFFFFE))


def zip_many_small(path):
    """Within the entry cap, but many thousands of relationships and sheets
    listed in one workbook, each with a missing part."""
    sheets = "".join(f'<sheet name="s{i}" sheetId="{i}" r:id="rId{i}"/>' for i in range(200_000))
    wb = (f'<workbook xmlns="{SS}" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
          f"<sheets>{sheets}</sheets></workbook>")
    _office(path, [("[Content_Types].xml", TYPES), ("xl/workbook.xml", wb)])


def nested_xml(path, depth=1_390_000):
    """An SVG whose root comes after 1.39 million open elements (4 MiB of
    `<g>`), so the size reader walks all of them before it finds `<svg>`."""
    _write_chunks(path, [b"<?xml version='1.0'?><!-- <svg> -->", b"<g>" * depth, b"<svg width='1' height='1'/>"])


def billion_laughs(path):
    """Entity expansion, in an SVG and in the shared strings of an XLSX."""
    ents = ['<!ENTITY lol "lol">'] + [f'<!ENTITY lol{i} "{("&lol%s;" % (i - 1 if i > 1 else "")) * 10}">' for i in range(1, 10)]
    dtd = "<!DOCTYPE svg [" + "".join(ents) + "]>"
    svg = f'<?xml version="1.0"?>{dtd}<svg width="&lol9;" height="10"><text>&lol9;</text></svg>'
    with open(path, "w") as f:
        f.write(svg)
    shared = f'<?xml version="1.0"?>{dtd.replace("svg", "sst")}<sst>' + "<si><t>&lol9;</t></si>" * 1000 + "</sst>"
    _xlsx(path[:-4] + ".xlsx", f'<worksheet xmlns="{SS}"/>', shared)


def huge_images(path):
    """Headers that promise 2^31 x 2^31 PNG, 65535 x 65535 GIF and JPEG
    pixels; the pixel data is a few bytes."""
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    big = (1 << 31) - 1
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", big, big, 8, 6, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"\x00" * (8 * MIB))) + chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(png)
    gif = b"GIF89a" + struct.pack("<HH", 65535, 65535) + b"\x00\x00\x00" + b"\x2c" + b"\x00" * 9 + b"\x3b"
    with open(path[:-4] + ".gif", "wb") as f:
        f.write(gif)
    # APP segments fill the first 4 MiB so the frame header is never reached
    # by a reader that stops there, then a 65535 x 65535 frame.
    app = b"\xff\xe1\xff\xff" + b"\x00" * 65533
    jpg = b"\xff\xd8" + app * 80 + b"\xff\xc0\x00\x11\x08\xff\xff\xff\xff\x03" + b"\x00" * 9 + b"\xff\xd9"
    with open(path[:-4] + ".jpg", "wb") as f:
        f.write(jpg)


def one_line_csv(path, size=99 * MIB):
    """A 99 MiB CSV with no newline: one record, one cell that starts a
    formula, then a row of a million cells."""
    cells = b"=1" + b"," * (1 << 20)
    rest = size - len(cells)
    _write_chunks(path, [cells] + [b"x" * MIB] * (rest // MIB) + [b"x" * (rest % MIB)])


def json_array(path):
    """4 MiB of `[0,0,...]` (two million values), of `[{"a":0},...]` (half a
    million one-key objects: a B-tree node each, over 300 MiB as a serde_json
    Value), of nested arrays and of one object's keys."""
    body = b"0," * (2 * MIB - 2)
    with open(path, "wb") as f:
        f.write(b"[" + body + b"0]")
    depth = 2 * MIB - 8
    with open(path[:-5] + "-deep.json", "wb") as f:
        f.write(b"[" * depth + b"]" * depth)
    n = (4 * MIB - 2) // 8
    with open(path[:-5] + "-objects.json", "wb") as f:
        f.write(b"[" + b'{"a":0},' * (n - 1) + b'{"a":0}]')
    keys = b",".join(b'"k%07d":0' % i for i in range(300_000))
    with open(path[:-5] + "-keys.json", "wb") as f:
        f.write(b"{" + keys + b"}")


def text_and_markup(path, size=99 * MIB):
    """99 MiB of HTML tags on one line, and 99 MiB of text without a newline."""
    tag = b'<a href="javascript:x" onclick="y">'
    n = size // len(tag)
    _write_chunks(path, [b"<!doctype html>"] + [tag * (MIB // len(tag))] * (n // (MIB // len(tag))))
    _write_chunks(path[:-5] + ".txt", [b"y" * MIB] * (size // MIB))


BOMBS = {
    "zip64_decoy": ("bomb.xlsx", zip64_decoy),
    "zip_inflate": ("inflate.xlsx", zip_inflate),
    "zip_many_small": ("many.xlsx", zip_many_small),
    "nested_xml": ("nested.svg", nested_xml),
    "billion_laughs": ("laughs.svg", billion_laughs),
    "huge_images": ("huge.png", huge_images),
    "one_line_csv": ("line.csv", one_line_csv),
    "json_array": ("array.json", json_array),
    "text_and_markup": ("tags.html", text_and_markup),
}


def make(name):
    file, fn = BOMBS[name]
    fn(file)
