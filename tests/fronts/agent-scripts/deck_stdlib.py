# Step 2 on the minimal rootfs: a small but complete .pptx (presentation,
# master, layout, theme, one slide per class) written with zipfile alone.
import csv
import zipfile
from xml.sax.saxutils import escape

rows = list(csv.DictReader(open("/workspace/output/summary.csv", newline="")))
titles = ["Titanic: survival by class"] + [
    f"Class {r['Pclass']}: {r['survived']} of {r['passengers']} survived ({float(r['rate']):.0%})" for r in rows
]

P = 'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships" xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"'
REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
CT = "application/vnd.openxmlformats-officedocument.presentationml"
TREE = '<p:nvGrpSpPr><p:cNvPr id="1" name=""/><p:cNvGrpSpPr/><p:nvPr/></p:nvGrpSpPr><p:grpSpPr/>'


def rels(items):
    body = "".join(f'<Relationship Id="rId{i}" Type="{REL}/{t}" Target="{target}"/>' for i, (t, target) in enumerate(items, 1))
    return f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">{body}</Relationships>'


def slide(title):
    shape = (
        '<p:sp><p:nvSpPr><p:cNvPr id="2" name="Title 1"/><p:cNvSpPr/><p:nvPr/></p:nvSpPr>'
        '<p:spPr><a:xfrm><a:off x="457200" y="2286000"/><a:ext cx="8229600" cy="1143000"/></a:xfrm>'
        '<a:prstGeom prst="rect"><a:avLst/></a:prstGeom></p:spPr>'
        f'<p:txBody><a:bodyPr/><a:lstStyle/><a:p><a:r><a:rPr lang="en-US" sz="3200"/><a:t>{escape(title)}</a:t></a:r></a:p></p:txBody></p:sp>'
    )
    return f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><p:sld {P}><p:cSld><p:spTree>{TREE}{shape}</p:spTree></p:cSld><p:clrMapOvr><a:masterClrMapping/></p:clrMapOvr></p:sld>'


def theme():
    colors = "".join(
        f"<a:{n}><a:srgbClr val=\"{v}\"/></a:{n}>"
        for n, v in [("dk1", "000000"), ("lt1", "FFFFFF"), ("dk2", "1F497D"), ("lt2", "EEECE1"), ("accent1", "4F81BD"),
                     ("accent2", "C0504D"), ("accent3", "9BBB59"), ("accent4", "8064A2"), ("accent5", "4BACC6"),
                     ("accent6", "F79646"), ("hlink", "0000FF"), ("folHlink", "800080")]
    )
    fonts = '<a:latin typeface="Calibri"/><a:ea typeface=""/><a:cs typeface=""/>'
    fill = '<a:solidFill><a:schemeClr val="phClr"/></a:solidFill>'
    line = f'<a:ln w="9525">{fill}</a:ln>'
    fmt = (
        f"<a:fillStyleLst>{fill * 3}</a:fillStyleLst><a:lnStyleLst>{line * 3}</a:lnStyleLst>"
        f"<a:effectStyleLst>{'<a:effectStyle><a:effectLst/></a:effectStyle>' * 3}</a:effectStyleLst>"
        f"<a:bgFillStyleLst>{fill * 3}</a:bgFillStyleLst>"
    )
    return (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
        '<a:theme xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main" name="Plain"><a:themeElements>'
        f'<a:clrScheme name="Plain">{colors}</a:clrScheme>'
        f'<a:fontScheme name="Plain"><a:majorFont>{fonts}</a:majorFont><a:minorFont>{fonts}</a:minorFont></a:fontScheme>'
        f'<a:fmtScheme name="Plain">{fmt}</a:fmtScheme></a:themeElements></a:theme>'
    )


n = len(titles)
clrmap = '<p:clrMap bg1="lt1" tx1="dk1" bg2="lt2" tx2="dk2" accent1="accent1" accent2="accent2" accent3="accent3" accent4="accent4" accent5="accent5" accent6="accent6" hlink="hlink" folHlink="folHlink"/>'
overrides = [("/ppt/presentation.xml", f"{CT}.presentation.main+xml"),
             ("/ppt/slideMasters/slideMaster1.xml", f"{CT}.slideMaster+xml"),
             ("/ppt/slideLayouts/slideLayout1.xml", f"{CT}.slideLayout+xml"),
             ("/ppt/theme/theme1.xml", "application/vnd.openxmlformats-officedocument.theme+xml")]
overrides += [(f"/ppt/slides/slide{i}.xml", f"{CT}.slide+xml") for i in range(1, n + 1)]
content_types = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
    '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
    '<Default Extension="xml" ContentType="application/xml"/>'
    + "".join(f'<Override PartName="{p}" ContentType="{t}"/>' for p, t in overrides)
    + "</Types>"
)
sld_ids = "".join(f'<p:sldId id="{255 + i}" r:id="rId{i + 2}"/>' for i in range(1, n + 1))
presentation = (
    f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><p:presentation {P}>'
    '<p:sldMasterIdLst><p:sldMasterId id="2147483648" r:id="rId1"/></p:sldMasterIdLst>'
    f'<p:sldIdLst>{sld_ids}</p:sldIdLst><p:sldSz cx="9144000" cy="6858000"/><p:notesSz cx="6858000" cy="9144000"/></p:presentation>'
)
master = (
    f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><p:sldMaster {P}><p:cSld><p:spTree>{TREE}</p:spTree></p:cSld>'
    f'{clrmap}<p:sldLayoutIdLst><p:sldLayoutId id="2147483649" r:id="rId1"/></p:sldLayoutIdLst></p:sldMaster>'
)
layout = (
    f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><p:sldLayout {P} type="blank"><p:cSld name="Blank"><p:spTree>{TREE}</p:spTree></p:cSld>'
    '<p:clrMapOvr><a:masterClrMapping/></p:clrMapOvr></p:sldLayout>'
)
with zipfile.ZipFile("/workspace/output/deck.pptx", "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("[Content_Types].xml", content_types)
    z.writestr("_rels/.rels", rels([("officeDocument", "ppt/presentation.xml")]))
    z.writestr("ppt/presentation.xml", presentation)
    z.writestr("ppt/_rels/presentation.xml.rels",
               rels([("slideMaster", "slideMasters/slideMaster1.xml"), ("theme", "theme/theme1.xml")]
                    + [("slide", f"slides/slide{i}.xml") for i in range(1, n + 1)]))
    z.writestr("ppt/slideMasters/slideMaster1.xml", master)
    z.writestr("ppt/slideMasters/_rels/slideMaster1.xml.rels",
               rels([("slideLayout", "../slideLayouts/slideLayout1.xml"), ("theme", "../theme/theme1.xml")]))
    z.writestr("ppt/slideLayouts/slideLayout1.xml", layout)
    z.writestr("ppt/slideLayouts/_rels/slideLayout1.xml.rels", rels([("slideMaster", "../slideMasters/slideMaster1.xml")]))
    z.writestr("ppt/theme/theme1.xml", theme())
    for i, t in enumerate(titles, 1):
        z.writestr(f"ppt/slides/slide{i}.xml", slide(t))
        z.writestr(f"ppt/slides/_rels/slide{i}.xml.rels", rels([("slideLayout", "../slideLayouts/slideLayout1.xml")]))
print("wrote /workspace/output/deck.pptx with", n, "slides")
