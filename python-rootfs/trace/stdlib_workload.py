"""The baseline for data-syscalls.txt: what a script using only the standard
library does (files, csv, json, zip, threads, hashing, time), so the data
workloads' extra syscalls stand out."""
import concurrent.futures
import csv
import datetime
import hashlib
import json
import os
import random
import re
import sqlite3
import statistics
import tempfile
import zipfile

rows = [{"region": random.choice(["north", "south"]), "units": random.randint(1, 9)} for _ in range(200)]
with open("/workspace/output/units.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=["region", "units"])
    w.writeheader()
    w.writerows(rows)
with open("/workspace/output/units.csv", newline="") as f:
    back = list(csv.DictReader(f))
totals = {}
for r in back:
    totals[r["region"]] = totals.get(r["region"], 0) + int(r["units"])
with tempfile.TemporaryDirectory() as tmp:
    db = sqlite3.connect(os.path.join(tmp, "t.db"))
    db.execute("create table t (region text, units int)")
    db.executemany("insert into t values (?, ?)", [(r["region"], int(r["units"])) for r in back])
    db.commit()
    db.close()
with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    digests = list(pool.map(lambda s: hashlib.sha256(s.encode()).hexdigest(), ["a", "b", "c"]))
with zipfile.ZipFile("/workspace/output/out.zip", "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("totals.json", json.dumps(totals))
print(json.dumps({"totals": totals, "mean": statistics.mean(int(r["units"]) for r in back),
                  "when": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  "digests": digests, "words": re.findall(r"\w+", "a b c")}))
