"""Summarise the example sales data with pandas and chart it with matplotlib:
runs on the data rootfs (make rootfs-data), e.g.
    jail run --rootfs python-rootfs/out/data --input examples/data --output OUT examples/analyse.py
"""
import matplotlib.pyplot as plt
import pandas as pd

sales = pd.read_csv("/workspace/input/sales.csv")
sales["revenue"] = sales["units"] * sales["price"]
by_region = sales.groupby("region")[["units", "revenue"]].sum().sort_values("revenue", ascending=False)
by_region.to_csv("/workspace/output/revenue_by_region.csv")

fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
by_region["revenue"].plot.bar(ax=ax, color="tab:blue")
ax.set_title("Revenue by region")
ax.set_ylabel("revenue")
fig.tight_layout()
fig.savefig("/workspace/output/revenue_by_region.png")

print(by_region.to_string(float_format=lambda v: f"{v:,.2f}"))
print("wrote revenue_by_region.csv and revenue_by_region.png")
