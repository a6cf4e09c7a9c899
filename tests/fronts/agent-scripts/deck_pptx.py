# Step 2 on the data rootfs: the deck made with python-pptx.
import csv
from pptx import Presentation

rows = list(csv.DictReader(open("/workspace/output/summary.csv", newline="")))
prs = Presentation()
s = prs.slides.add_slide(prs.slide_layouts[0])
s.shapes.title.text = "Titanic: survival by class"
for r in rows:
    s = prs.slides.add_slide(prs.slide_layouts[5])
    s.shapes.title.text = f"Class {r['Pclass']}: {r['survived']} of {r['passengers']} survived"
prs.save("/workspace/output/deck.pptx")
print("wrote /workspace/output/deck.pptx with", len(prs.slides), "slides")
