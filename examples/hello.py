"""Summarise the example sales data: runs on the minimal (standard library) rootfs."""
import csv
import json
from collections import defaultdict

revenue = defaultdict(float)
with open("/workspace/input/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        revenue[row["region"]] += int(row["units"]) * float(row["price"])

with open("/workspace/output/revenue.json", "w") as out:
    json.dump(revenue, out, indent=2, sort_keys=True)
for region, total in sorted(revenue.items(), key=lambda kv: -kv[1]):
    print(f"{region:>6}: {total:8.2f}")
