# Step 1, fixed: survival by passenger class, written to summary.csv.
import csv
from collections import defaultdict

rows = list(csv.DictReader(open("/workspace/input/titanic.csv", newline="")))
by = defaultdict(lambda: [0, 0])
for r in rows:
    by[r["Pclass"]][0] += 1
    by[r["Pclass"]][1] += int(r["Survived"])
with open("/workspace/output/summary.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["Pclass", "passengers", "survived", "rate"])
    for k in sorted(by):
        n, s = by[k]
        w.writerow([k, n, s, round(s / n, 3)])
print("rows", len(rows), "survived", sum(v[1] for v in by.values()))
