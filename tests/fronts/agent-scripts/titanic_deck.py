# Item 3: the deck, from the summary table and the charts.
import csv
from pptx import Presentation
from pptx.util import Inches

rows = list(csv.DictReader(open("/workspace/output/summary.csv", newline="")))
prs = Presentation()
s = prs.slides.add_slide(prs.slide_layouts[0])
s.shapes.title.text = "Titanic: who survived"
s.placeholders[1].text = "An EDA of the first 100 passengers"
for png, title in [("survival_by_class_sex.png", "Survival by class and sex"), ("age_histogram.png", "Ages")]:
    s = prs.slides.add_slide(prs.slide_layouts[5])
    s.shapes.title.text = title
    s.shapes.add_picture(f"/workspace/output/{png}", Inches(1.5), Inches(1.5), width=Inches(7))
s = prs.slides.add_slide(prs.slide_layouts[1])
s.shapes.title.text = "Survival rate by class and sex"
s.placeholders[1].text = "\n".join(f"class {r['Pclass']}, {r['Sex']}: {float(r['survival_rate']):.0%} of {r['passengers']}" for r in rows)
prs.save("/workspace/output/presentation.pptx")
print("wrote presentation.pptx with", len(prs.slides), "slides")
