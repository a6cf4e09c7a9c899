# Item 2: charts (a fresh session: load again).
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

df = pd.read_csv("/workspace/input/titanic.csv")
fig, ax = plt.subplots(figsize=(6, 4))
df.groupby(["Pclass", "Sex"])["Survived"].mean().unstack().plot.bar(ax=ax)
ax.set_ylabel("survival rate")
ax.set_title("Survival by class and sex")
fig.tight_layout()
fig.savefig("/workspace/output/survival_by_class_sex.png", dpi=100)
fig, ax = plt.subplots(figsize=(6, 4))
df["Age"].dropna().plot.hist(bins=16, ax=ax)
ax.set_xlabel("age")
ax.set_title("Passenger ages")
fig.tight_layout()
fig.savefig("/workspace/output/age_histogram.png", dpi=100)
print("wrote 2 charts")
