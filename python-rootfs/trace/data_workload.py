"""The data workloads of tests/tests/data_stack.rs in one script, traced by
trace-syscalls.sh to make data-syscalls.txt: read a CSV and an XLSX with
pandas and group, plot with matplotlib and seaborn, write XLSX, PPTX and
DOCX files and read them back, decode the PNG, fit scikit-learn models,
numpy and scipy linear algebra."""
import json

import numpy as np
import openpyxl
import pandas as pd
import matplotlib.pyplot as plt
import seaborn as sns
import scipy.stats
from docx import Document
from PIL import Image
from pptx import Presentation
from pptx.util import Inches
from sklearn.cluster import KMeans
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from tabulate import tabulate

out = "/workspace/output"
with open(f"{out}/units.csv", "w") as f:
    f.write("region,units\nnorth,3\nsouth,5\nnorth,4\neast,1\n")
wb = openpyxl.Workbook()
ws = wb.active
ws.title = "prices"
ws.append(["region", "price"])
for row in [("north", 2.5), ("south", 1.0), ("east", 10.0)]:
    ws.append(row)
wb.save(f"{out}/prices.xlsx")
units = pd.read_csv(f"{out}/units.csv")
prices = pd.read_excel(f"{out}/prices.xlsx")
table = units.groupby("region", as_index=False)["units"].sum().merge(prices, on="region")

fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
ax.bar(table["region"], table["units"])
fig.savefig(f"{out}/chart.png")
sns.barplot(data=units, x="region", y="units", estimator="sum", errorbar=None).figure.savefig(f"{out}/sns.png")
img = Image.open(f"{out}/chart.png")
img.load()

prs = Presentation()
s = prs.slides.add_slide(prs.slide_layouts[0])
s.shapes.title.text = "Units"
s = prs.slides.add_slide(prs.slide_layouts[1])
s.placeholders[1].text_frame.text = "North leads"
s = prs.slides.add_slide(prs.slide_layouts[5])
s.shapes.add_picture(f"{out}/chart.png", Inches(1), Inches(1.5), width=Inches(8))
prs.save(f"{out}/deck.pptx")
slides = len(Presentation(f"{out}/deck.pptx").slides)
doc = Document()
doc.add_heading("Units", level=1)
doc.add_picture(f"{out}/sns.png", width=Inches(4))
doc.save(f"{out}/report.docx")
paragraphs = len(Document(f"{out}/report.docx").paragraphs)

X, y = load_iris(return_X_y=True)
acc = LogisticRegression(max_iter=1000).fit(X, y).score(X, y)
rng = np.random.default_rng(0)
blobs = np.vstack([rng.normal(0, 0.3, (50, 2)), rng.normal(5, 0.3, (50, 2))])
km = KMeans(n_clusters=2, n_init=3, random_state=0).fit(blobs)
a = rng.random((300, 300)) + 300 * np.eye(300)
inv_ok = bool(np.allclose(a @ np.linalg.inv(a), np.eye(300)))
print(json.dumps({"slides": slides, "paragraphs": paragraphs, "accuracy": acc, "inv_ok": inv_ok,
                  "size": img.size, "t": float(scipy.stats.ttest_ind(X[:50, 0], X[50:100, 0]).statistic),
                  "table": tabulate(table, headers="keys")}))
