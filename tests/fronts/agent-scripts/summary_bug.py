# Step 1, first try: a typo the model must fix from the traceback.
import csv

rows = list(csv.DictReader(open("/workspace/input/titanic.csv", newline="")))
print("rows", len(rowz))
